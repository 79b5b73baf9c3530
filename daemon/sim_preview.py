"""``python -m daemon.sim_preview``: the noiseless truth of planned trials, for ``coordinator sweep --preview``. SIMULATED.

The coordinator never imports the daemon (the wings stand side by side on ``servetune``), and the
simulated trial needs the daemon's own request planning (:mod:`daemon.workload`, file datasets),
so ``--preview`` runs this module as a child process: one JSON job on stdin, one JSON answer on
stdout. It starts no server, opens no socket and writes no file.

Job: ``{"targets": [{"backend": BackendSpec, "slos": [SLO], "deadline_s": float, "drain_timeout_s":
float, "configs": {config_id: EngineConfig}, "points": [{"config_id": str, "load_point": LoadPoint}]}]}``.

Answer, per target: ``profile``, ``calibration``, ``model_shape``; per config ``{"kv_cache_tokens": int}``
or ``{"error": short reason, "log_line": vLLM's wording}``; per point (configs that start)
``{"config_id", "load_point", "metrics": TrialMetrics, "sim_s": simulated seconds}``. Every metric
is the expected value with the noise off (:func:`daemon.sim_backend.expected_trial`). File
datasets count prompt tokens with the tiny model's tokenizer when the spec serves it and this node has
generated it, else at about 4 characters per token; a point that cannot be planned without a
tokenizer (ShareGPT) is answered ``{"config_id", "load_point", "skipped": why}``.

Rate sweeps (``rate_sweeps``: the spec's load points with a ``rate_sweep``; ``points`` carry their
``@sync`` and ``@max`` seeds): where a config played both seeds, the follow-up load points the sweep
would add from their request throughputs (:func:`servetune.manifest.rate_sweep_next`, the sweep's own
rule) are played too, as points with ``followup_of`` (the spec's load point) and ``request_rate``;
``rate_sweeps`` in the answer lists, per config and sweep, ``sync_rps``, ``max_rps`` and the ``rates``
chosen (empty: the maximum is not above the synchronous, so the sweep adds none).
"""

from __future__ import annotations

import json
import sys
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from daemon.datasets import DatasetError
from daemon.serverlog import classify_failure
from daemon.sim_backend import expected_trial, sim_server
from daemon.tiny_model import default_cache_dir
from servetune.manifest import EngineConfig, rate_sweep_next
from servetune.sim.engine import SimStartError
from servetune.sim.profiles import DEFAULT_SIM_PROFILE, DEFAULT_SIM_SHAPE, get_profile
from servetune.spec import DERIVED_MARK, SLO, BackendSpec, LoadPoint


class PreviewPoint(BaseModel):
    model_config = ConfigDict(extra="forbid")

    config_id: str
    load_point: LoadPoint


class PreviewTargetJob(BaseModel):
    """One hardware profile's share of a preview (see the module docstring)."""

    model_config = ConfigDict(extra="forbid")

    backend: BackendSpec
    slos: list[SLO] = Field(default_factory=list)
    deadline_s: float = Field(900.0, gt=0)
    drain_timeout_s: float = Field(60.0, gt=0)
    configs: dict[str, EngineConfig]
    points: list[PreviewPoint]
    tiny_model: bool = Field(False, description="the spec serves the tiny model: use its tokenizer if this node has it")
    rate_sweeps: list[LoadPoint] = Field(default_factory=list,
                                         description="the spec's rate-sweep load points (their seeds are in points)")


class PreviewJob(BaseModel):
    model_config = ConfigDict(extra="forbid")

    targets: list[PreviewTargetJob]


def preview_target(job: PreviewTargetJob) -> dict[str, Any]:
    """Start every config of ``job`` on the simulated server and play its points without noise."""
    backend = job.backend.model_copy(update={"noise": False})
    configs: dict[str, dict[str, Any]] = {}
    servers = {}
    for cid, config in job.configs.items():
        try:
            servers[cid] = sim_server(backend, config)
        except SimStartError as exc:
            configs[cid] = {"error": classify_failure(exc.log_line) or exc.log_line, "log_line": exc.log_line}
            continue
        configs[cid] = {"kv_cache_tokens": servers[cid].kv_cache_tokens}
    tokenizer = None
    if job.tiny_model and (default_cache_dir() / "tokenizer.json").is_file():
        tokenizer = str(default_cache_dir() / "tokenizer.json")
    points: list[dict[str, Any]] = []

    def play(config_id: str, lp: LoadPoint, extra: dict[str, Any]) -> dict[str, Any] | None:
        server = servers.get(config_id)
        if server is None:
            return None
        try:
            metrics, sim_s = expected_trial(server, backend, lp, job.slos, server.shape.vocab_size,
                                            job.deadline_s, job.drain_timeout_s, tokenizer_path=tokenizer)
        except DatasetError as exc:  # e.g. a ShareGPT file whose lengths need a tokenizer this node lacks
            points.append({"config_id": config_id, "load_point": lp.name, "skipped": str(exc), **extra})
            return None
        point = {"config_id": config_id, "load_point": lp.name, "metrics": metrics.model_dump(mode="json"),
                 "sim_s": sim_s, **extra}
        points.append(point)
        return point

    played = {(p.config_id, p.load_point.name): play(p.config_id, p.load_point, {}) for p in job.points}
    sweeps: list[dict[str, Any]] = []
    for parent in job.rate_sweeps:
        for cid in servers:
            sync, top = (played.get((cid, f"{parent.name}{DERIVED_MARK}{s}")) for s in ("sync", "max"))
            if sync is None or top is None:
                continue
            sync_rps, max_rps = (float(s["metrics"]["request_throughput"]) for s in (sync, top))
            followups = rate_sweep_next(parent, sync_rps, max_rps)
            sweeps.append({"config_id": cid, "load_point": parent.name, "sync_rps": sync_rps, "max_rps": max_rps,
                           "rates": [lp.request_rate for lp in followups]})
            for lp in followups:
                play(cid, lp, {"followup_of": parent.name, "request_rate": lp.request_rate})
    some = next(iter(servers.values()), None)
    profile = some.profile if some is not None else get_profile(backend.profile or DEFAULT_SIM_PROFILE)
    return {"profile": profile.name, "calibration": profile.calibration,
            "model_shape": backend.model_shape or DEFAULT_SIM_SHAPE, "configs": configs, "points": points,
            "rate_sweeps": sweeps}


def main(stdin: Any = None, stdout: Any = None) -> int:
    stdin = stdin or sys.stdin
    stdout = stdout or sys.stdout
    try:
        job = PreviewJob.model_validate_json(stdin.read())
    except ValueError as exc:
        print(f"error: the preview job is not valid: {exc}", file=sys.stderr)
        return 2
    json.dump({"targets": [preview_target(t) for t in job.targets]}, stdout, allow_nan=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
