"""The sim's GPU profiles against published vLLM figures: ``python -m benchmarks.sim.published``. SIMULATED.

The GPU profiles (:mod:`servetune.sim.profiles`) cannot be calibrated on this machine: they are
**uncalibrated (from published specs)**. This script puts their noiseless predictions
(:func:`daemon.sim_backend.expected_metrics`) next to vLLM throughput and latency figures that
someone published together with their setup, so a reader can see how far off they are. It does not
fit anything and nothing here changes a profile.

Source of every figure: Lambda's vLLM benchmark (https://github.com/LambdaLabsML/vllm-benchmark,
report ``benchmark_v0.md``; per-run JSON written by vLLM's ``benchmarks/benchmark_serving.py``
under ``results/prompt_<N>/<GPUs>/``). Their setup, as the repository states it:

- vLLM ``v0.5.4`` (the ``vllm/vllm-openai:v0.5.4`` image in ``benchmark_1x2x4x8x.sh``; "This
  benchmark was conducted with vLLM v0.5.4" in ``benchmark_v0.md``);
- ``meta-llama/Meta-Llama-3-8B-Instruct`` and ``Meta-Llama-3-70B-Instruct``, ``--dtype`` not given
  (``auto``: the checkpoints' bfloat16), ``--max-model-len`` from the file name (2048 on H100,
  2000 on A100), ``--tensor-parallel-size`` from the file name;
- ``--gpu-memory-utilization 0.95`` and ``--max-num-seqs 1024``: the defaults of ``benchmark.py``
  in the stored version read here (commit 29dd18a); that the 2024-09-07 runs used that version is
  **not confirmed**;
- chunked prefill and prefix caching not set (vLLM 0.5.4's defaults at this ``max_model_len``:
  both off, so ``max_num_batched_tokens`` = max(max_model_len, 2048) = 2048);
- ``benchmark_serving.py --backend vllm --endpoint /v1/completions --dataset-name sharegpt``,
  ``--request-rate inf`` (every request sent at once), ``--num-prompts`` 10 or 320, no
  ``--ignore-eos``: the JSON records each request's prompt tokens and generated tokens, and the
  simulation replays exactly those lengths (a request that generated 0 tokens, TTFT recorded as 0,
  is replayed as a 1-token request; its 0 ms is in the published median TTFT).

Figures for H200 and L40S, and Lambda's vLLM 0.6.0 tables (GPU not stated in the table), are not
here: see benchmarks/RESULTS.md. The 2xA100 70B run in the same repository failed (32 of 320
requests completed, 0 output tokens) and is left out.
"""

from __future__ import annotations

import hashlib
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path

from daemon.sim_backend import expected_metrics
from servetune.manifest import EngineConfig
from servetune.metrics import TrialMetrics
from servetune.sim.profiles import get_profile
from servetune.spec import BackendSpec, EngineArgs, FileDataset, LoadPoint

REPO = "https://github.com/LambdaLabsML/vllm-benchmark"

#: prompt tokens of the first 320 ShareGPT prompts (benchmark_serving.py's sample at seed 0): the
#: ``input_lens`` of every 320-prompt JSON below (identical in all three); the 10-prompt runs are its first 10
SHAREGPT_320_INPUT = [
    13, 25, 27, 10, 329, 29, 399, 328, 4, 205, 16, 372, 403, 9, 12, 770, 227, 8, 14, 390, 659, 59, 76, 744, 619,
    279, 344, 9, 10, 45, 11, 4, 80, 768, 317, 40, 619, 8, 298, 16, 17, 696, 575, 11, 7, 281, 12, 147, 481, 770,
    336, 6, 331, 9, 45, 222, 802, 481, 93, 641, 22, 15, 16, 77, 32, 689, 178, 9, 628, 480, 42, 336, 24, 515, 761,
    112, 113, 348, 82, 467, 245, 11, 24, 343, 13, 387, 258, 32, 28, 225, 248, 35, 133, 98, 27, 23, 58, 363, 203,
    140, 140, 230, 310, 521, 768, 317, 298, 336, 491, 19, 10, 59, 48, 20, 20, 54, 107, 53, 72, 18, 10, 768, 7, 933,
    239, 277, 26, 35, 462, 386, 25, 23, 17, 20, 44, 661, 631, 349, 53, 71, 37, 10, 21, 37, 496, 8, 9, 353, 10, 595,
    5, 49, 286, 305, 56, 43, 52, 310, 35, 7, 7, 238, 10, 143, 660, 191, 72, 39, 258, 312, 49, 9, 15, 561, 76, 561,
    501, 8, 66, 15, 303, 19, 455, 27, 143, 688, 9, 31, 361, 21, 117, 8, 12, 775, 338, 176, 349, 166, 419, 401, 307,
    169, 647, 21, 9, 34, 12, 37, 45, 154, 8, 10, 18, 253, 486, 611, 96, 19, 62, 529, 15, 30, 10, 445, 680, 762,
    441, 77, 12, 276, 178, 22, 159, 95, 366, 4, 7, 770, 8, 45, 480, 90, 32, 329, 768, 72, 86, 53, 83, 419, 44, 14,
    56, 28, 707, 235, 27, 668, 17, 427, 44, 370, 8, 674, 455, 185, 68, 19, 132, 304, 9, 34, 39, 54, 768, 661, 404,
    240, 25, 95, 60, 24, 12, 85, 66, 62, 462, 22, 241, 25, 32, 13, 175, 31, 342, 43, 339, 144, 233, 16, 10, 11,
    269, 587, 8, 233, 10, 48, 9, 335, 22, 61, 29, 692, 7, 332, 512, 13, 128, 24,
]

H100_8B_320_OUTPUT = [
    120, 613, 233, 194, 101, 741, 9, 3, 6, 31, 392, 84, 396, 45, 291, 9, 173, 277, 334, 37, 587, 372, 36, 135, 26,
    45, 450, 118, 226, 4, 5, 146, 59, 11, 567, 192, 476, 130, 13, 223, 188, 16, 35, 276, 202, 492, 239, 129, 26, 79,
    17, 204, 11, 207, 78, 340, 17, 9, 123, 6, 559, 5, 316, 26, 417, 206, 151, 42, 25, 18, 159, 0, 25, 267, 19, 12,
    768, 67, 628, 11, 218, 296, 382, 49, 125, 0, 26, 237, 350, 13, 490, 408, 58, 29, 512, 413, 526, 16, 416, 434,
    451, 17, 573, 0, 7, 8, 11, 22, 0, 249, 281, 392, 611, 572, 23, 256, 31, 39, 300, 355, 340, 9, 172, 458, 147,
    240, 154, 768, 0, 141, 42, 26, 780, 334, 125, 4, 4, 721, 63, 24, 331, 482, 110, 216, 184, 99, 285, 22, 355, 40,
    150, 46, 0, 0, 574, 572, 214, 0, 419, 163, 162, 77, 482, 170, 510, 53, 16, 384, 57, 9, 170, 356, 173, 19, 390,
    339, 77, 17, 520, 8, 8, 198, 510, 478, 304, 398, 16, 475, 91, 54, 509, 608, 36, 425, 15, 25, 12, 363, 0, 0, 44,
    43, 267, 474, 334, 31, 261, 402, 346, 176, 22, 22, 159, 203, 8, 16, 16, 216, 86, 0, 234, 258, 247, 23, 47, 16,
    447, 221, 702, 0, 44, 142, 740, 18, 76, 299, 250, 24, 300, 178, 5, 373, 25, 23, 76, 322, 87, 389, 21, 7, 527,
    485, 339, 394, 11, 27, 254, 313, 392, 111, 365, 0, 79, 11, 275, 22, 99, 373, 38, 0, 657, 283, 503, 250, 16,
    407, 0, 7, 261, 322, 322, 91, 56, 365, 342, 316, 25, 441, 646, 241, 222, 4, 27, 290, 7, 21, 336, 16, 360, 199,
    381, 297, 18, 338, 301, 189, 373, 478, 394, 23, 230, 455, 283, 0, 201, 0, 20, 308, 30, 295,
]

A100_8B_320_OUTPUT = [
    120, 547, 233, 194, 101, 741, 9, 3, 6, 38, 392, 84, 396, 45, 291, 9, 173, 277, 334, 37, 587, 372, 36, 135, 26,
    45, 450, 118, 226, 4, 5, 146, 59, 11, 567, 192, 447, 130, 13, 223, 188, 16, 35, 276, 202, 492, 239, 129, 26, 79,
    17, 204, 11, 207, 78, 340, 21, 9, 123, 6, 559, 5, 316, 26, 417, 206, 151, 42, 25, 18, 159, 0, 25, 267, 19, 12,
    768, 67, 628, 11, 218, 296, 371, 49, 125, 0, 26, 237, 350, 13, 490, 408, 58, 29, 512, 413, 526, 16, 416, 434,
    451, 17, 573, 0, 7, 8, 11, 22, 0, 249, 281, 392, 611, 572, 23, 256, 31, 39, 300, 355, 340, 9, 172, 458, 78, 20,
    154, 768, 0, 141, 42, 26, 780, 334, 125, 4, 4, 721, 63, 24, 331, 481, 110, 216, 184, 99, 285, 22, 355, 40, 150,
    46, 0, 0, 574, 561, 214, 0, 419, 163, 162, 77, 482, 170, 510, 53, 16, 384, 57, 9, 170, 351, 173, 19, 390, 339,
    552, 17, 520, 8, 8, 198, 510, 478, 304, 398, 16, 475, 91, 54, 509, 608, 36, 425, 15, 25, 12, 363, 0, 0, 44, 43,
    267, 437, 334, 31, 261, 402, 346, 176, 22, 22, 159, 203, 8, 16, 16, 216, 86, 0, 234, 258, 247, 23, 47, 16, 447,
    221, 702, 0, 44, 142, 740, 18, 76, 299, 250, 24, 300, 178, 5, 373, 25, 23, 76, 322, 87, 389, 21, 7, 527, 485,
    339, 394, 11, 27, 254, 313, 392, 111, 365, 0, 79, 11, 275, 22, 99, 373, 38, 0, 657, 283, 503, 250, 16, 407, 0,
    7, 261, 393, 321, 91, 56, 365, 343, 316, 25, 444, 646, 241, 222, 4, 27, 290, 7, 21, 336, 16, 360, 199, 313, 297,
    18, 338, 301, 189, 373, 478, 394, 23, 230, 455, 283, 0, 201, 0, 20, 308, 30, 295,
]

H100X4_70B_320_OUTPUT = [
    120, 604, 233, 194, 101, 741, 0, 0, 6, 35, 392, 30, 396, 45, 291, 9, 173, 277, 334, 0, 587, 372, 14, 90, 0, 0,
    450, 118, 219, 4, 5, 146, 21, 11, 0, 192, 230, 130, 0, 223, 188, 0, 0, 276, 202, 492, 239, 120, 0, 31, 17, 204,
    11, 207, 78, 311, 9, 0, 0, 6, 559, 5, 316, 0, 417, 207, 151, 42, 25, 0, 159, 0, 25, 133, 0, 12, 768, 67, 628, 0,
    48, 296, 501, 0, 125, 0, 0, 227, 350, 0, 490, 408, 0, 29, 512, 413, 394, 0, 90, 434, 417, 17, 110, 0, 7, 0, 11,
    0, 0, 249, 281, 392, 587, 572, 23, 256, 31, 39, 300, 355, 340, 9, 172, 294, 0, 0, 154, 768, 0, 127, 42, 26, 564,
    274, 125, 4, 0, 159, 63, 24, 331, 431, 110, 216, 0, 99, 285, 0, 134, 40, 150, 0, 0, 0, 574, 528, 214, 0, 419,
    163, 162, 77, 428, 170, 510, 0, 11, 384, 0, 0, 170, 356, 173, 19, 302, 0, 42, 17, 520, 8, 8, 198, 408, 434, 304,
    0, 16, 475, 0, 54, 509, 608, 36, 425, 0, 0, 0, 363, 0, 0, 0, 0, 267, 304, 334, 31, 261, 402, 308, 0, 20, 22,
    159, 203, 0, 0, 16, 216, 86, 0, 234, 258, 247, 0, 47, 0, 0, 221, 702, 0, 44, 142, 740, 18, 0, 292, 250, 24, 300,
    178, 0, 373, 25, 0, 76, 322, 87, 331, 0, 0, 527, 485, 287, 394, 0, 27, 254, 313, 392, 111, 365, 0, 79, 11, 0,
    22, 99, 373, 0, 0, 657, 283, 503, 235, 16, 1, 0, 0, 261, 373, 322, 91, 56, 365, 343, 316, 0, 444, 302, 241, 222,
    4, 145, 290, 0, 15, 319, 0, 360, 199, 335, 297, 0, 338, 143, 80, 373, 478, 394, 0, 230, 455, 275, 0, 201, 0, 11,
    308, 0, 295,
]


@dataclass(frozen=True)
class Published:
    """One published run: where it is, its setup, its lengths and the figures it reports."""

    path: str
    profile: str
    shape: str
    tp: int
    max_model_len: int
    input_lens: list[int]
    output_lens: list[int]
    #: the JSON's own totals, checked against the lengths above (a transcription check)
    total_input: int
    total_output: int
    output_throughput: float
    median_ttft_ms: float
    median_tpot_ms: float

    @property
    def setup(self) -> str:
        n = len(self.input_lens)
        gpus = f"{self.tp}x{self.profile}"
        zeros = sum(1 for o in self.output_lens if o == 0)
        return (f"{gpus}, {self.shape} (Meta-Llama-3 Instruct, bf16), vLLM 0.5.4, TP {self.tp}, max_model_len "
                f"{self.max_model_len}, ShareGPT {n} prompts at rate inf (mean {self.total_input / n:.0f} in / "
                f"{self.total_output / n:.0f} out tokens; {zeros} with 0 out)")


FIGURES = [
    Published(path="results/prompt_10/1xH100-80GB-SXM/Meta-Llama-3-8B-Instruct_tp1_len2048.json",
              profile="H100-80G", shape="llama-3-8b", tp=1, max_model_len=2048,
              input_lens=SHAREGPT_320_INPUT[:10], output_lens=[120, 429, 233, 194, 101, 741, 9, 3, 6, 31],
              total_input=1369, total_output=1867,
              output_throughput=347.8919151936622, median_ttft_ms=62.1947320032632,
              median_tpot_ms=7.558259615148475),
    Published(path="results/prompt_10/1xA100-80GB-SXM/Meta-Llama-3-8B-Instruct_tp1_len2000.json",
              profile="A100-80G", shape="llama-3-8b", tp=1, max_model_len=2000,
              input_lens=SHAREGPT_320_INPUT[:10], output_lens=[120, 507, 233, 194, 101, 741, 9, 3, 6, 31],
              total_input=1369, total_output=1945,
              output_throughput=227.03837146571024, median_ttft_ms=139.06319253146648,
              median_tpot_ms=11.955695146418893),
    Published(path="results/prompt_320/1xH100-80GB-SXM/Meta-Llama-3-8B-Instruct_tp1_len2048.json",
              profile="H100-80G", shape="llama-3-8b", tp=1, max_model_len=2048,
              input_lens=SHAREGPT_320_INPUT, output_lens=H100_8B_320_OUTPUT,
              total_input=65578, total_output=65331,
              output_throughput=6026.612126585249, median_ttft_ms=1731.3668639981188,
              median_tpot_ms=20.034419094805514),
    Published(path="results/prompt_320/1xA100-80GB-SXM/Meta-Llama-3-8B-Instruct_tp1_len2000.json",
              profile="A100-80G", shape="llama-3-8b", tp=1, max_model_len=2000,
              input_lens=SHAREGPT_320_INPUT, output_lens=A100_8B_320_OUTPUT,
              total_input=65578, total_output=65374,
              output_throughput=3107.488463112791, median_ttft_ms=3696.992026641965,
              median_tpot_ms=40.85785709321499),
    Published(path="results/prompt_320/4xH100-80GB-SXM/Meta-Llama-3-70B-Instruct_tp4_len2048.json",
              profile="H100-80G", shape="llama-3-70b", tp=4, max_model_len=2048,
              input_lens=SHAREGPT_320_INPUT, output_lens=H100X4_70B_320_OUTPUT,
              total_input=65578, total_output=56543,
              output_throughput=2445.2950585472913, median_ttft_ms=2753.8576154911425,
              median_tpot_ms=39.05382768727246),
]


def check(fig: Published) -> None:
    """The transcribed lengths add up to the JSON's totals (a wrong digit fails here, not silently)."""
    if len(fig.input_lens) != len(fig.output_lens):
        raise ValueError(f"{fig.path}: {len(fig.input_lens)} input lengths but {len(fig.output_lens)} output lengths")
    if sum(fig.input_lens) != fig.total_input or sum(fig.output_lens) != fig.total_output:
        raise ValueError(f"{fig.path}: lengths sum to {sum(fig.input_lens)} in / {sum(fig.output_lens)} out, "
                         f"the JSON says {fig.total_input} / {fig.total_output}")


def dataset_file(fig: Published, folder: Path) -> FileDataset:
    """A JSONL file of the run's requests: a prompt of 4n characters is n tokens to the sim (no
    tokenizer: about 4 characters per token), ``output_len`` the tokens the run generated (0 -> 1)."""
    lines = [f'{{"prompt": "{"abcd" * n}", "output_len": {max(1, o)}}}' for n, o in zip(fig.input_lens, fig.output_lens)]
    raw = ("\n".join(lines) + "\n").encode()
    path = folder / (Path(fig.path).stem + f"_{len(lines)}.jsonl")
    path.write_bytes(raw)
    return FileDataset(kind="jsonl", path=str(path), sha256=hashlib.sha256(raw).hexdigest())


def simulate(fig: Published, folder: Path) -> TrialMetrics:
    n = len(fig.input_lens)
    backend = BackendSpec(kind="sim", profile=fig.profile, model_shape=fig.shape, noise=False)
    args = EngineArgs(max_model_len=fig.max_model_len, max_num_seqs=1024, max_num_batched_tokens=2048,
                      enable_chunked_prefill=False, enable_prefix_caching=False, gpu_memory_utilization=0.95,
                      dtype="bfloat16", tensor_parallel_size=fig.tp)
    lp = LoadPoint(name=f"published-{n}", max_concurrency=n, num_requests=n, dataset=dataset_file(fig, folder))
    return expected_metrics(backend, EngineConfig(args=args), lp)


def _median(values: list[float], quantiles: list[float]) -> float:
    return values[quantiles.index(0.5)]


def _fmt(x: float) -> str:
    return "n/a" if math.isnan(x) else (f"{x:,.0f}" if abs(x) >= 100 else f"{x:.2f}")


def _label(fig: Published) -> str:
    return f"{fig.tp}x{fig.profile} {fig.shape} {len(fig.input_lens)} prompts"


def main() -> None:
    for fig in FIGURES:
        check(fig)
    rows = []
    with tempfile.TemporaryDirectory(prefix="servetune-published-") as tmp:
        for i, fig in enumerate(FIGURES, start=1):
            m = simulate(fig, Path(tmp))
            for metric, published, simulated in (
                ("output tok/s", fig.output_throughput, m.output_throughput),
                ("median TTFT ms", fig.median_ttft_ms, _median(m.ttft_ms, m.quantiles)),
                ("median TPOT ms", fig.median_tpot_ms, _median(m.tpot_ms, m.quantiles)),
            ):
                ratio = simulated / published if published else math.nan
                rows.append(f"| [{i}] | {_label(fig)} | {metric} | {_fmt(published)} | {_fmt(simulated)} SIMULATED "
                            f"| {ratio:.2f} |")
    print("Sources (per-run JSON of vLLM's benchmark_serving.py in Lambda's vllm-benchmark) and setups:\n")
    for i, fig in enumerate(FIGURES, start=1):
        calib = get_profile(fig.profile).calibration
        print(f"- [{i}] [{fig.path}]({REPO}/blob/main/{fig.path}): {fig.setup}. "
              f"Simulated on {fig.tp}x sim profile {fig.profile}, {calib}.")
    print("\nSimulated: daemon.sim_backend.expected_metrics (noiseless), engine args max_model_len as published, "
          "max_num_seqs 1024, max_num_batched_tokens 2048, chunked prefill and prefix caching off, "
          "gpu_memory_utilization 0.95. Every GPU profile is uncalibrated (from published specs).\n")
    print("| source | setup | metric | published | simulated (uncalibrated profile) | simulated / published |")
    print("| --- | --- | --- | --- | --- | --- |")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
