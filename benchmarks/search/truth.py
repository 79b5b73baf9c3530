"""Simulated outcomes of one surface: the noiseless truth of every grid config (cached on disk) and
seeded noisy draws, each as the sweep records it (metrics from :func:`servetune.metrics.summary_dict`
over the simulator's request samples, wrapped in the :class:`~servetune.ranking.TrialSummary` the
planners are told). SIMULATED.

GPU-seconds of a trial follow the sweep preview's cost model (:mod:`coordinator.preview`): a server
start (``GPU_START_BASE_S`` plus the weights read at ``WEIGHT_LOAD_BYTES_S``, per engine config:
one load point, one repeat, so one start per trial), the trial's simulated span (warm-up included)
and ``TRIAL_OVERHEAD_S``, times ``tensor_parallel_size``; a config that would not start pays its start.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coordinator.preview import GPU_START_BASE_S, TRIAL_OVERHEAD_S, WEIGHT_LOAD_BYTES_S
from daemon.sim_backend import expected_trial, sim_server, simulate_trial
from servetune.manifest import EngineConfig, at_fidelity
from servetune.metrics import summary_dict
from servetune.ranking import TrialSummary, meets_slos
from servetune.sim.engine import SimStartError
from servetune.sim.profiles import get_shape
from servetune.spec import ExperimentSpec

#: noisy trials never hit the daemon's budget here: a trial timeout would be a measurement failure
DEADLINE_S = 3600.0


@dataclass(frozen=True)
class Outcome:
    """One simulated trial of one config: its metrics (None: the server would not start) and GPU-seconds."""

    metrics: dict[str, Any] | None
    gpu_s: float


def start_s(spec: ExperimentSpec, config: EngineConfig) -> float:
    tp = config.args.tensor_parallel_size or 1
    shape = get_shape(spec.backend.model_shape or "tiny")
    return GPU_START_BASE_S + shape.weight_bytes / tp / WEIGHT_LOAD_BYTES_S


def simulate(spec: ExperimentSpec, config: EngineConfig, seed: int | None, fidelity: float = 1.0) -> Outcome:
    """One trial of ``config`` at the spec's load point (shortened to ``fidelity`` as a
    successive-halving rung plans it): noisy under ``seed``, the truth when None."""
    tp = config.args.tensor_parallel_size or 1
    backend = spec.backend.model_copy(update={"noise": seed is not None})
    lp = at_fidelity(spec.load_points[0], fidelity)
    try:
        server = sim_server(backend, config)
    except SimStartError:
        return Outcome(None, start_s(spec, config) * tp)
    if seed is None:
        m, span = expected_trial(server, backend, lp, spec.slos, vocab_size=server.shape.vocab_size,
                                 deadline_s=DEADLINE_S)
        metrics = m.model_dump(mode="json")
    else:
        trial = simulate_trial(server, backend, lp, seed=seed, deadline_s=DEADLINE_S, vocab_size=server.shape.vocab_size)
        metrics = summary_dict(trial.samples, trial.window_s, spec.slos, offered_rate=trial.offered_rate,
                               concurrency_capped=lp.max_concurrency is not None)
        s = trial.samples
        span = (max(x.end_ns for x in s) - min(x.send_ns for x in s)) / 1e9 if s else 0.0
    return Outcome(metrics, (start_s(spec, config) + span + TRIAL_OVERHEAD_S) * tp)


def summary(spec: ExperimentSpec, config: EngineConfig, outcome: Outcome) -> TrialSummary:
    """The trial as the sweep tells it: ok with its metrics, or failed as a ``measurement``."""
    lp = spec.load_points[0].name
    return TrialSummary(trial_id=f"{config.config_id}:{lp}", config_id=config.config_id, config_label=config.label(),
                        load_point=lp, status="ok" if outcome.metrics is not None else "failed",
                        failure_kind=None if outcome.metrics is not None else "measurement",
                        metrics=outcome.metrics or {})


def true_value(spec: ExperimentSpec, outcome: Outcome) -> float:
    """The SLO-constrained objective on the truth: the objective where every SLO is met, else -inf."""
    m = outcome.metrics
    if m is None or m.get(spec.ranking.objective) is None:
        return -math.inf
    if spec.ranking.require_slos and meets_slos([m.get("slos")]) is False:
        return -math.inf
    return float(m[spec.ranking.objective])


def _slim(m: dict[str, Any] | None) -> dict[str, Any] | None:
    """What the planners and the ranking read of a trial's metrics (kept small on disk)."""
    if m is None:
        return None
    keep = ("quantiles", "request_throughput", "output_throughput", "total_token_throughput", "request_goodput",
            "slo_attainment", "slos", "ttft_ms", "tpot_ms", "e2el_ms", "n_errors", "client_fell_behind")
    return {k: m.get(k) for k in keep}


class Cache:
    """Outcomes on disk, one JSON file per surface and draw (``seed`` None: the truth), keyed by the
    surface's spec and config ids; written back by :meth:`save`."""

    def __init__(self, folder: Path | None, spec: ExperimentSpec):
        self.folder = folder
        self.spec = spec
        key = hashlib.sha256(json.dumps(spec.model_dump(mode="json"), sort_keys=True).encode()).hexdigest()[:12]
        self.tag = f"{spec.name}-{key}"
        self.mem: dict[str, dict[str, Outcome]] = {}
        self.dirty: set[str] = set()

    def _file(self, draw: str) -> Path | None:
        return None if self.folder is None else self.folder / f"{self.tag}-{draw}.json"

    def _table(self, draw: str) -> dict[str, Outcome]:
        if draw not in self.mem:
            table: dict[str, Outcome] = {}
            f = self._file(draw)
            if f is not None and f.exists():
                table = {k: Outcome(v["m"], v["g"]) for k, v in json.loads(f.read_text()).items()}
            self.mem[draw] = table
        return self.mem[draw]

    def get(self, config: EngineConfig, seed: int | None, fidelity: float = 1.0) -> Outcome:
        """The outcome of ``config`` in draw ``seed`` (None: the truth), at ``fidelity`` of the load
        point (a shorter trial is a draw of its own: its own noise, its own GPU-seconds)."""
        draw = ("truth" if seed is None else f"seed{seed}") + ("" if fidelity >= 1 else f"-f{fidelity:g}")
        table = self._table(draw)
        got = table.get(config.config_id)
        if got is None:
            noise = None if seed is None else _draw_seed(seed, config.config_id + ("" if fidelity >= 1 else f"@{fidelity:g}"))
            out = simulate(self.spec, config, noise, fidelity)
            got = table[config.config_id] = Outcome(_slim(out.metrics), out.gpu_s)
            self.dirty.add(draw)
        return got

    def save(self) -> None:
        if self.folder is None:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        for draw in sorted(self.dirty):
            f = self._file(draw)
            assert f is not None
            f.write_text(json.dumps({k: {"m": o.metrics, "g": o.gpu_s} for k, o in self.mem[draw].items()}))
        self.dirty.clear()


def _draw_seed(seed: int, config_id: str) -> int:
    """The noise seed of ``config``'s draw in benchmark seed ``seed`` (shared by every planner: common
    random numbers, so planners differ by what they ask, not by their luck with the noise)."""
    return int.from_bytes(hashlib.sha256(f"searchbench:{seed}:{config_id}".encode()).digest()[:8], "big")
