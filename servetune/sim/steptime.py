"""Roofline time of one engine step (pure arithmetic, no numpy on the hot path).

One vLLM engine step runs one forward pass over every token scheduled in it (prefill chunks and
one token per running decode). Its time here is

    max(FLOPs / (peak_flops x flops_efficiency), bytes / (bandwidth x bandwidth_efficiency))
      + step_overhead + per_seq_overhead x sequences + per_token_overhead x tokens
      + tensor-parallel all-reduce time,

per device of a tensor-parallel group of ``tp`` (weights, FLOPs and KV heads split ``tp`` ways):

- FLOPs: ``2 x matmul params x tokens`` + the LM head for every sequence that samples
  (``2 x hidden x vocab``) + attention ``4 x layers x q_heads x head_dim x sum(new x (context + (new + 1) / 2))``;
- bytes: the weights once per step + the KV cache each sequence reads (its context before the
  step) and writes (its new tokens);
- all-reduce: two per layer (after attention and after the MLP) over ``tokens x hidden``
  activations, ring algorithm: ``2 (tp - 1) / tp x bytes / interconnect + latency`` each.

A run of pure decode steps with a fixed batch grows every context by one per step, so its step
times are ``max(a_c + b_c j, a_m + b_m j) + k`` for step *j*: :meth:`StepModel.decode_line` gives
those coefficients and the simulator sums whole runs of such steps in closed form.
"""

from __future__ import annotations

from dataclasses import dataclass

from servetune.sim.profiles import HardwareProfile, ModelShape


@dataclass(frozen=True)
class DecodeLine:
    """Step *j* of a decode run takes ``max(ac + bc*j, am + bm*j) + k`` seconds (before noise)."""

    ac: float
    bc: float
    am: float
    bm: float
    k: float

    def at(self, j: float) -> float:
        return max(self.ac + self.bc * j, self.am + self.bm * j) + self.k


class StepModel:
    """Step times of one model shape on ``tp`` devices of one profile."""

    def __init__(self, profile: HardwareProfile, shape: ModelShape, tp: int = 1, enforce_eager: bool = False):
        self.profile, self.shape, self.tp = profile, shape, tp
        flops_rate = profile.peak_flops * profile.flops_efficiency * tp
        bytes_rate = profile.mem_bandwidth_bytes_s * profile.bandwidth_efficiency
        s = shape
        #: seconds of compute per token through the matmuls, per sampling sequence, per attention unit
        self.c_token = 2.0 * s.matmul_params / flops_rate
        self.c_logit = 2.0 * s.hidden_size * s.vocab_size / flops_rate
        self.c_attn = 4.0 * s.num_layers * s.num_attention_heads * s.head_dim / flops_rate
        #: seconds of memory traffic for the weights (once per step) and per KV token read or written
        self.m_weights = s.weight_bytes / tp / bytes_rate
        self.m_kv = s.kv_bytes_per_token(tp) / bytes_rate
        self.k_step = profile.step_overhead_s + (profile.eager_overhead_s if enforce_eager else 0.0)
        self.k_seq = profile.per_seq_overhead_s
        comm_token = 0.0
        comm_step = 0.0
        if tp > 1:
            per_token = s.hidden_size * s.dtype_bytes * 2.0 * (tp - 1) / tp / profile.interconnect_bytes_s
            comm_token = 2 * s.num_layers * per_token
            comm_step = 2 * s.num_layers * profile.allreduce_latency_s
        self.k_token = profile.per_token_overhead_s + comm_token
        self.k_step += comm_step

    def step(self, tokens: int, seqs: int, sampling: int, attn_units: float, context_read: float) -> float:
        """One step: ``tokens`` scheduled over ``seqs`` sequences, ``sampling`` of which sample a
        token; ``attn_units`` = sum(new x (context + (new + 1) / 2)); ``context_read`` = sum of contexts before it."""
        compute = self.c_token * tokens + self.c_logit * sampling + self.c_attn * attn_units
        memory = self.m_weights + self.m_kv * (context_read + tokens)
        return max(compute, memory) + self.k_step + self.k_seq * seqs + self.k_token * tokens

    def decode_line(self, batch: int, context_sum: float) -> DecodeLine:
        """Coefficients of the decode run of ``batch`` sequences whose contexts sum to ``context_sum``
        at its first step (each context grows by one per step)."""
        ac = (self.c_token + self.c_logit) * batch + self.c_attn * (context_sum + batch)
        am = self.m_weights + self.m_kv * (context_sum + batch)
        return DecodeLine(ac=ac, bc=self.c_attn * batch, am=am, bm=self.m_kv * batch,
                          k=self.k_step + (self.k_seq + self.k_token) * batch)
