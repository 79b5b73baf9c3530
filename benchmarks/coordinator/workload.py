"""The experiment the benchmark's coordinator runs: one spec, sized in trials and batches.

A batch is one (engine config, repeat) pair and holds one trial per load point. ``repeats`` is at
most 100 (:class:`servetune.spec.ExperimentSpec`) and backend ``openai`` allows no engine space,
so an ``openai`` spec has at most 100 batches: too few to keep 1,000 daemons leased. Two shapes:

- ``grid`` (the default): backend ``vllm`` with ``engine.grid.max_num_seqs`` over ``configs``
  values, x ``repeats``: ``configs * repeats`` batches of ``load_points`` trials each. No vLLM is
  ever started: the daemons are fakes.
- ``openai``: backend ``openai`` at ``http://127.0.0.1:9`` (never contacted), ``repeats`` batches
  of ``load_points`` trials each (the shape the issue names; 100 batches at most).
"""

from __future__ import annotations

from dataclasses import dataclass

import yaml

SHAPES = ("grid", "openai")
NEVER_CONTACTED_URL = "http://127.0.0.1:9"


@dataclass(frozen=True)
class Workload:
    shape: str
    configs: int
    repeats: int
    load_points: int

    def __post_init__(self) -> None:
        if self.shape not in SHAPES:
            raise ValueError(f"unknown workload shape {self.shape!r}; known: {', '.join(SHAPES)}")
        if not 1 <= self.repeats <= 100:
            raise ValueError(f"repeats must be 1..100 (the spec's limit), got {self.repeats}")
        if self.shape == "openai" and self.configs != 1:
            raise ValueError("backend 'openai' has exactly one config (no engine space)")
        if self.configs < 1 or self.load_points < 1:
            raise ValueError("configs and load_points must be at least 1")

    @property
    def batches(self) -> int:
        return self.configs * self.repeats

    @property
    def trials(self) -> int:
        return self.batches * self.load_points

    def describe(self) -> str:
        backend = "backend vllm, engine.grid.max_num_seqs" if self.shape == "grid" else "backend openai"
        return (f"{self.trials} trials in {self.batches} batches of {self.load_points} "
                f"({backend}: {self.configs} config(s) x {self.repeats} repeats)")

    def spec_yaml(self, name: str) -> str:
        spec: dict[str, object] = {
            "name": name,
            "description": "benchmarks/coordinator: served by FAKE daemons with an instant backend",
            "model": {"source": "tiny"},
            "repeats": self.repeats,
            "load_points": [
                {"name": f"lp{i}", "request_rate": 10.0 * (i + 1), "num_requests": 4} for i in range(self.load_points)
            ],
        }
        if self.shape == "grid":
            spec["backend"] = {"kind": "vllm"}
            spec["engine"] = {"grid": {"max_num_seqs": [8 * (i + 1) for i in range(self.configs)]}}
        else:
            spec["backend"] = {"kind": "openai", "base_url": NEVER_CONTACTED_URL}
        return yaml.safe_dump(spec, sort_keys=False)


def sized(shape: str, n_daemons: int, trials: int, load_points: int = 4, min_batches_per_daemon: int = 2) -> Workload:
    """A workload of about ``trials`` trials (for ``grid``, at least ``min_batches_per_daemon``
    batches per daemon, so that every daemon can hold a lease; ``openai`` has 100 batches and as
    many load points as it takes)."""
    if shape == "openai":
        return Workload("openai", 1, 100, max(load_points, -(-trials // 100)))
    batches = max(-(-trials // load_points), min_batches_per_daemon * n_daemons)
    repeats = min(100, batches)
    configs = max(1, -(-batches // repeats))
    return Workload("grid", configs, repeats, load_points)
