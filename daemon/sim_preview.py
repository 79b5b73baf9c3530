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
from servetune.manifest import EngineConfig
from servetune.sim.engine import SimStartError
from servetune.sim.profiles import DEFAULT_SIM_PROFILE, DEFAULT_SIM_SHAPE, get_profile
from servetune.spec import SLO, BackendSpec, LoadPoint


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
    for p in job.points:
        server = servers.get(p.config_id)
        if server is None:
            continue
        try:
            metrics, sim_s = expected_trial(server, backend, p.load_point, job.slos, server.shape.vocab_size,
                                            job.deadline_s, job.drain_timeout_s, tokenizer_path=tokenizer)
        except DatasetError as exc:  # e.g. a ShareGPT file whose lengths need a tokenizer this node lacks
            points.append({"config_id": p.config_id, "load_point": p.load_point.name, "skipped": str(exc)})
            continue
        points.append({"config_id": p.config_id, "load_point": p.load_point.name,
                       "metrics": metrics.model_dump(mode="json"), "sim_s": sim_s})
    some = next(iter(servers.values()), None)
    profile = some.profile if some is not None else get_profile(backend.profile or DEFAULT_SIM_PROFILE)
    return {"profile": profile.name, "calibration": profile.calibration,
            "model_shape": backend.model_shape or DEFAULT_SIM_SHAPE, "configs": configs, "points": points}


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
