"""Engine configs, trial manifests and plans: :func:`plan_configs` turns the configs a design chose
(``coordinator.planning``, the planners) into batches of trial manifests.

A :class:`TrialManifest` is frozen canonical JSON; its sha256 is the trial id. It names the model
by what it is (``tiny`` + generator version, a hub id + revision, or a local model's folder name +
the sha256 of its config.json), never by where it lies on one machine, so the same trial has the
same id on every node. Where to load the model from travels beside the manifest, in the GRANT.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, Self

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from servetune.canonical import drop_added_defaults, sha256_json
from servetune.memfit import Pruner, memory_pruner
from servetune.sla import first_rates
from servetune.spec import (
    DERIVED_MARK,
    MAX_MODEL_CONFIG_BYTES,
    EngineArgs,
    ExperimentSpec,
    LoadPoint,
    ModelSpec,
    engine_architecture,
    engine_combination_problems,
)
from servetune.tiny import tiny_identity
from servetune.yamlsafe import read_regular_file

MANIFEST_VERSION = 1

#: Fields added to manifests (or to the load point and engine config inside them) after the first
#: trials were recorded, as dotted paths into the manifest's JSON dump, with the default a trial
#: made before the field existed holds. Left out of the trial id while they hold it; a field added
#: without an entry here changes every trial id (``tests/test_compat.py`` resumes folders recorded
#: by the protocol-1 code and fails if anything would run again). A field of a spec model also
#: needs its entry in :data:`servetune.spec.ADDED_SPEC_FIELDS`.
ADDED_MANIFEST_FIELDS: dict[str, object] = {"hardware_target": None, "tags": [], "load_point.sla_search": None,
                                            "fidelity": 1.0}

#: A shortened load point (:func:`at_fidelity`) keeps at least this many measured requests (or all
#: of them when it has fewer): fewer say nothing about a p99.
MIN_FIDELITY_REQUESTS = 8
#: ... and at least this many seconds of a duration-bound load point (or all of it when shorter).
MIN_FIDELITY_SECONDS = 5.0

#: The tag a trial moved to another hardware class carries (``failover-from:<class or daemon>``):
#: it has its own trial id, and no analysis may take it for the trial it stands in for.
FAILOVER_TAG_PREFIX = "failover-from:"


class EngineConfig(BaseModel):
    """What needs a server restart: engine args plus the server's environment variables."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    args: EngineArgs = Field(default_factory=EngineArgs)
    env: dict[str, str] = Field(default_factory=dict)

    @property
    def config_id(self) -> str:
        """sha256 of the canonical args (unset ones left out) and environment."""
        return sha256_json({"args": self.args.model_dump(exclude_none=True), "env": dict(sorted(self.env.items()))})

    def label(self, only: Collection[str] | None = None) -> str:
        """A short human description: the set args, then env (``only``: just these names,
        engine args by name and env vars as ``env.NAME``, e.g. the swept ones)."""
        parts = [
            f"{_SHORT_NAMES.get(k, k)}={_short(v)}"
            for k, v in self.args.model_dump(exclude_none=True).items()
            if only is None or k in only
        ]
        parts += [f"{k}={v}" for k, v in sorted(self.env.items()) if only is None or f"env.{k}" in only]
        return " ".join(parts) if parts else "(vLLM defaults)"


_SHORT_NAMES = {
    "max_num_batched_tokens": "batched_tokens",
    "enable_chunked_prefill": "chunked_prefill",
    "enable_prefix_caching": "prefix_caching",
    "gpu_memory_utilization": "gpu_mem_util",
    "tensor_parallel_size": "tp",
}


def swept_names(configs: Iterable[EngineConfig]) -> list[str]:
    """Engine args (by name) and env vars (``env.NAME``) whose value differs across ``configs``."""
    configs = list(configs)
    names = [n for n in EngineArgs.model_fields if len({repr(getattr(c.args, n)) for c in configs}) > 1]
    env_names = sorted({k for c in configs for k in c.env})
    names += [f"env.{k}" for k in env_names if len({c.env.get(k) for c in configs}) > 1]
    return names


def _short(value: object) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


#: Where a manifest keeps its computed trial id: in the instance ``__dict__`` beside the fields
#: (pydantic's ``__eq__``, ``__repr__`` and ``model_dump`` look at fields only).
_TRIAL_ID_KEY = "_trial_id"


class TrialManifest(BaseModel):
    """Immutable description of one trial: engine config x load point x repeat."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    manifest_version: int = MANIFEST_VERSION
    experiment: str
    model: dict[str, str]
    backend: str
    target: str | None = Field(None, description="openai backend: the base URL of the endpoint measured")
    config_id: str
    engine: EngineConfig
    load_point: LoadPoint
    repeat: int = 0
    baseline_run: int | None = None
    hardware_target: Annotated[str, StringConstraints(min_length=1, max_length=250)] | None = Field(
        None, description="the spec's hardware target this trial is planned for: a class, or filter:<name> "
                          "(servetune.hardware); None: no targets named, any class")
    tags: tuple[Annotated[str, StringConstraints(min_length=1, max_length=300)], ...] = Field((), max_length=16, description="marks such as failover-from:<class or daemon>")
    fidelity: float = Field(1.0, gt=0, le=1, description="the fraction of the spec load point's requests (or duration) "
                                                          "this trial measures: 1 for a full trial, less for a "
                                                          "successive-halving rung (its load_point is the shortened one)")

    @property
    def trial_id(self) -> str:
        """sha256 of the canonical manifest, leaving out where a dataset file lies on this machine
        (its content is named by its sha256), and fields added since manifest version 1 while they
        hold their default (:data:`ADDED_MANIFEST_FIELDS`), so every trial id ever recorded stays valid.

        Computed once per instance (the coordinator asks for it on every message): the model is
        frozen, :meth:`model_copy` drops the cached id, and nothing may mutate a manifest's nested
        dicts in place (``model``, ``engine.env``), which pydantic's ``frozen`` does not forbid."""
        cached = self.__dict__.get(_TRIAL_ID_KEY)
        if cached is None:
            data = drop_added_defaults(self.model_dump(mode="json"), ADDED_MANIFEST_FIELDS)
            data["load_point"]["dataset"].pop("path", None)
            cached = self.__dict__[_TRIAL_ID_KEY] = sha256_json(data)
        return str(cached)

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A copy, with ``update`` applied, that computes its own trial id (pydantic copies
        ``__dict__``, where the cached id lives, and applies ``update`` without validation)."""
        copied = super().model_copy(update=update, deep=deep)
        copied.__dict__.pop(_TRIAL_ID_KEY, None)
        return copied

    @property
    def is_baseline(self) -> bool:
        return self.baseline_run is not None

    @property
    def failover_from(self) -> str | None:
        """Where this trial was moved from (its ``failover-from:`` tag), or None for an original."""
        return next((t.removeprefix(FAILOVER_TAG_PREFIX) for t in self.tags if t.startswith(FAILOVER_TAG_PREFIX)), None)


def model_identity(spec: ModelSpec) -> dict[str, str]:
    """What a manifest records as the model: what it is, never a machine-local path."""
    if spec.source == "tiny":
        return tiny_identity()
    if spec.source == "hub":
        assert spec.id is not None
        return {"source": "hub", "id": spec.id, "revision": spec.revision or "main"}
    assert spec.path is not None
    path = Path(spec.path)
    try:
        digest = hashlib.sha256(read_regular_file(path / "config.json", MAX_MODEL_CONFIG_BYTES)).hexdigest()
    except (OSError, ValueError):  # missing, or not a regular file (refused by the spec check)
        digest = "unreadable"
    return {"source": "path", "name": path.name, "config_sha256": digest}


@dataclass(frozen=True)
class PlannedBatch:
    """One GRANT's worth of work: one engine config and its trials in run order."""

    index: int
    config: EngineConfig
    trials: tuple[TrialManifest, ...]
    is_baseline: bool = False

    @cached_property
    def config_id(self) -> str:
        """Computed once per batch (a sha256: the coordinator's core reads it for every GRANT and
        every new lease); the dataclass and its config are frozen."""
        return self.config.config_id

    @property
    def hardware_target(self) -> str | None:
        """The hardware target its trials are planned for (:attr:`TrialManifest.hardware_target`)."""
        return self.trials[0].hardware_target if self.trials else None


@dataclass(frozen=True)
class PrunedConfig:
    """An engine config planning left out before any trial, on one hardware target, and why
    (:class:`StartCheck`): it is recorded with the plan, never dropped silently."""

    config: EngineConfig
    hardware_target: str | None
    reason: str
    is_baseline: bool = False

    @property
    def config_id(self) -> str:
        return self.config.config_id


class StartCheck:
    """Why an engine config cannot run, known before any trial: a combination of engine args vLLM
    refuses to start with (:func:`servetune.spec.engine_combination_problems`, against the served
    model's architecture, on every target), or too little device memory on a hardware target
    (:func:`servetune.memfit.memory_pruner`). Planning leaves such a config out and records it with
    the reason (:class:`PrunedConfig`); no design spends a server start on it."""

    def __init__(self, spec: ExperimentSpec, *, memory: bool = True):
        self.arch = engine_architecture(spec)
        self.memory: Pruner | None
        self.memory, self.notes = memory_pruner(spec) if memory else (None, ())
        self.targets: list[str | None] = list(spec.hardware.labels() if spec.hardware is not None else []) or [None]
        self._verdicts: dict[tuple[str, str | None], str | None] = {}

    def reason(self, config: EngineConfig, target: str | None) -> str | None:
        """Why ``config`` cannot run on ``target`` (None: nothing known against it)."""
        key = (config.config_id, target)
        if key not in self._verdicts:
            problems = engine_combination_problems(config.args, self.arch)
            if problems:
                self._verdicts[key] = "; ".join(problems)
            elif self.memory is not None:
                self._verdicts[key] = self.memory(config.args.model_dump(exclude_none=True), config.env, target)
            else:
                self._verdicts[key] = None
        return self._verdicts[key]

    def pruned_everywhere(self, config: EngineConfig, is_baseline: bool = False) -> list[PrunedConfig]:
        """``config``'s pruned entries, one per target, when it cannot run on any target (else [])."""
        reasons = [(t, self.reason(config, t)) for t in self.targets]
        if any(r is None for _, r in reasons):
            return []
        return [PrunedConfig(config=config, hardware_target=t, reason=str(r), is_baseline=is_baseline)
                for t, r in reasons]


@dataclass(frozen=True)
class Plan:
    """The whole run order of an experiment, with how it was made (for provenance)."""

    experiment: str
    batches: tuple[PlannedBatch, ...]
    design: str = "grid"
    randomized: bool = True
    seed: int = 0
    notes: tuple[str, ...] = field(default_factory=tuple)
    #: rate-sweep load point name -> how many follow-up rates each of its seed pairs adds
    followup_rates: dict[str, int] = field(default_factory=dict)
    #: configs left out before any trial (vLLM refuses their args, or they cannot fit in device memory), with the reason
    pruned: tuple[PrunedConfig, ...] = field(default_factory=tuple)
    #: where the memory check could prune nothing, why (e.g. no hardware target names its memory)
    prune_notes: tuple[str, ...] = field(default_factory=tuple)

    def trials(self) -> list[TrialManifest]:
        return [t for b in self.batches for t in b.trials]

    def configs(self) -> dict[str, EngineConfig]:
        return {b.config_id: b.config for b in self.batches}

    def estimate_seconds(self, server_start_s: float = 50.0, per_trial_overhead_s: float = 3.0) -> float:
        """Rough wall time: every batch starts a server, every trial runs its load point; each rate
        sweep of a batch that will add follow-ups (:meth:`followup_starts`) adds a batch of its
        follow-up rates (decided at run time), with its own server start."""
        total = 0.0
        for b in self.batches:
            total += server_start_s + sum(t.load_point.expected_seconds() + per_trial_overhead_s for t in b.trials)
            followups = self.followups_per_batch(b)
            if followups:
                per = b.trials[0].load_point.expected_seconds() + per_trial_overhead_s
                total += self.followup_starts(b) * server_start_s + followups * per
        return total

    def wall_estimate_seconds(self, backend_kind: str) -> float | None:
        """The wall time a sweep of this plan is expected to take on ``backend.kind`` (the first ETA
        of its progress): an ``openai`` endpoint has no server starts; ``sim`` runs in seconds, at
        a pace no estimate here knows (None: the ETA waits for its first trials)."""
        if backend_kind == "sim":
            return None
        return self.estimate_seconds(server_start_s=0 if backend_kind == "openai" else 50.0)

    def estimate_text(self, backend_kind: str) -> str:
        """The estimated wall time as ``validate`` and ``--dry-run`` say it, for ``backend.kind``: an
        ``openai`` endpoint has no server starts; the ``sim`` backend runs in seconds, so its figure
        is what real vLLM would take, and says so."""
        if backend_kind == "openai":
            return f"estimated {_fmt_duration(self.estimate_seconds(server_start_s=0))} (no server starts)"
        per_start = "about 50 s per server start on a 2-core CPU machine"
        secs = _fmt_duration(self.estimate_seconds(server_start_s=50))
        if backend_kind == "sim":
            return f"SIMULATED: runs in seconds; on real vLLM about {secs} ({per_start})"
        return f"estimated {secs} ({per_start})"

    def _seed_pairs(self, batch: PlannedBatch) -> list[tuple[str, bool]]:
        """``(rate sweep, adds follow-ups)`` for each rate sweep whose ``@sync`` and ``@max`` seeds are
        both in ``batch`` (what :func:`coordinator.sweep.expand_rate_sweeps` pairs up). It adds none
        when its ``@max`` runs one request at a time too (the engine's ``max_num_seqs`` or the sweep's
        ``max_concurrency`` 1): ``@max`` cannot then beat ``@sync`` but by noise."""
        names = {t.load_point.name for t in batch.trials}
        seats = batch.config.args.max_num_seqs
        out = []
        for t in batch.trials:
            parent = sweep_parent(t.load_point.name)
            if (parent is None or not t.load_point.name.endswith(DERIVED_MARK + "max")
                    or not self.followup_rates.get(parent) or f"{parent}{DERIVED_MARK}sync" not in names):
                continue
            one_at_a_time = min(t.load_point.max_concurrency or 2, seats if seats is not None else 2) <= 1
            out.append((parent, not one_at_a_time))
        return out

    def sweeps_adding_followups(self, batch: PlannedBatch) -> list[str]:
        """The rate sweeps of ``batch`` that add follow-ups once their seeds are ok (the sweep's rule too)."""
        return [p for p, adds in self._seed_pairs(batch) if adds]

    def followups_per_batch(self, batch: PlannedBatch) -> int:
        """How many follow-up rate trials this batch's rate sweeps will add (decided at run time)."""
        return sum(self.followup_rates[p] for p in self.sweeps_adding_followups(batch))

    def followup_starts(self, batch: PlannedBatch) -> int:
        """How many more server starts this batch's rate sweeps will take: one per rate sweep that
        adds follow-ups (the sweep queues each seed pair's follow-ups as a batch of its own)."""
        return len(self.sweeps_adding_followups(batch))

    def single_seat_sweeps(self) -> int:
        """How many (batch, rate sweep) seed pairs are counted with no follow-up because their ``@max``
        runs one request at a time (:meth:`_seed_pairs`)."""
        return sum(1 for b in self.batches for _, adds in self._seed_pairs(b) if not adds)


def rate_sweep_seeds(lp: LoadPoint) -> list[LoadPoint]:
    """The two load points a rate sweep starts with: ``@sync`` (one request at a time) and ``@max``."""
    assert lp.rate_sweep is not None
    base = lp.model_dump(exclude={"name", "rate_sweep", "arrival", "burstiness", "request_rate", "max_concurrency"})
    base["stop"]["over_saturation"] = False  # closed loops: their concurrency bounds the queue
    return [
        LoadPoint(**base, name=f"{lp.name}{DERIVED_MARK}sync", max_concurrency=1),
        LoadPoint(**base, name=f"{lp.name}{DERIVED_MARK}max", max_concurrency=lp.rate_sweep.max_concurrency),
    ]


def rate_sweep_rates(sync_rps: float, max_rps: float, n: int) -> list[float]:
    """``n`` request rates evenly spaced strictly between the synchronous and the maximum
    throughput (3 significant digits); none when the maximum is not above the synchronous."""
    if not (max_rps > sync_rps > 0):
        return []
    step = (max_rps - sync_rps) / (n + 1)
    return [float(f"{sync_rps + step * (i + 1):.3g}") for i in range(n)]


def rate_sweep_followups(lp: LoadPoint, rates: list[float]) -> list[LoadPoint]:
    """The follow-up load points of a rate sweep at ``rates`` (open loop, the sweep's arrival process)."""
    base = lp.model_dump(exclude={"name", "rate_sweep", "request_rate", "max_concurrency"})
    return [LoadPoint(**base, name=f"{lp.name}{DERIVED_MARK}{rate:g}rps", request_rate=rate) for rate in rates]


def rate_sweep_next(lp: LoadPoint, sync_rps: float, max_rps: float) -> list[LoadPoint]:
    """What a rate sweep adds once one config's ``@sync`` and ``@max`` request throughputs are known:
    its follow-up load points (none when the maximum is not above the synchronous). The one rule the
    sweep (:func:`coordinator.sweep.expand_rate_sweeps`) and its preview both apply."""
    assert lp.rate_sweep is not None
    return rate_sweep_followups(lp, rate_sweep_rates(sync_rps, max_rps, lp.rate_sweep.num_rates))


def sla_points(lp: LoadPoint, rates: Sequence[float]) -> list[LoadPoint]:
    """An SLA search's load points at ``rates`` (``<name>@<rate>rps``, open loop, the search's arrival
    process): ordinary fixed-rate load points, each a trial of its own."""
    assert lp.sla_search is not None
    base = lp.model_dump(exclude={"name", "sla_search", "request_rate", "max_concurrency"})
    return [LoadPoint(**base, name=f"{lp.name}{DERIVED_MARK}{rate:g}rps", request_rate=rate) for rate in rates]


def sla_first_round(lp: LoadPoint) -> list[LoadPoint]:
    """The rates an SLA search plans before any result (:func:`servetune.sla.first_rates`)."""
    s = lp.sla_search
    assert s is not None
    return sla_points(lp, first_rates(s.min_rps, s.max_rps, s.rates_per_round))


def sweep_parent(name: str) -> str | None:
    """The spec load point a derived (rate-sweep) load point name comes from, else None."""
    return name.split(DERIVED_MARK, 1)[0] if DERIVED_MARK in name else None


def plan_grid(spec: ExperimentSpec) -> Plan:
    """Every config x load point x repeat, one batch (one server start) per (config, repeat), or per
    config with ``restart_per_repeat: false``: the grid design's plan (``coordinator.planning`` holds
    the designs; this is the plan of a spec without one).

    With ``planner.randomize`` the batch order and the trial order inside each batch are
    shuffled under ``planner.seed``; the order is part of the plan and recorded with the results.
    Baseline batches run first, after every ``baseline.every_batches`` batches, and last.
    """
    configs = [EngineConfig(args=a, env=e) for a, e in spec.engine.expand()]
    return plan_configs(spec, configs, design="grid")


def for_target(trials: tuple[TrialManifest, ...], target: str | None) -> tuple[TrialManifest, ...]:
    """``trials`` planned for hardware ``target`` (its manifest label; None: as they are)."""
    if target is None:
        return trials
    return tuple(m.model_copy(update={"hardware_target": target}) for m in trials)


def at_fidelity(lp: LoadPoint, fidelity: float) -> LoadPoint:
    """``lp`` shortened to ``fidelity`` of its measured requests (rounded up, at least
    :data:`MIN_FIDELITY_REQUESTS`) or of its duration (at least :data:`MIN_FIDELITY_SECONDS`); its
    name, arrival, lengths, warm-up and stop conditions unchanged. ``lp`` itself at fidelity 1."""
    if fidelity >= 1:
        return lp
    update: dict[str, Any] = {}
    if lp.num_requests is not None:
        update["num_requests"] = max(min(lp.num_requests, MIN_FIDELITY_REQUESTS), math.ceil(lp.num_requests * fidelity))
    if lp.duration_s is not None:
        update["duration_s"] = max(min(lp.duration_s, MIN_FIDELITY_SECONDS), lp.duration_s * fidelity)
    return LoadPoint.model_validate({**lp.model_dump(), **update})


def plan_configs(
    spec: ExperimentSpec, configs: Sequence[EngineConfig], *, design: str = "grid", notes: Sequence[str] = (),
    prune: bool = True, fidelity: float = 1.0,
) -> Plan:
    """Plan ``configs`` (chosen by a design, in the engine space's order) x load point x repeat, as
    :func:`plan_grid` describes; ``design`` and ``notes`` are recorded in the plan.

    With ``prune``, a batch whose config cannot run on its hardware target (:class:`StartCheck`: a
    combination of engine args vLLM refuses, or too little device memory) is left out and recorded in :attr:`Plan.pruned` with
    the reason, once per (config, target); where nothing can be pruned :attr:`Plan.prune_notes` say why.

    With hardware targets (``spec.hardware``), every batch is planned once per target, one after
    the other in the spec's order (``b0@A, b0@B, b1@A, ...``), with the same load-point order, the
    target in each manifest: one config is measured on each target, never part of the grid on each.

    ``fidelity`` < 1 (a successive-halving rung) plans the configs' load points shortened by
    :func:`at_fidelity`, each trial recording its fidelity; baseline batches stay at full fidelity."""
    rng = random.Random(spec.planner.seed)
    ident = model_identity(spec.model)
    backend = spec.backend.kind
    target = spec.backend.base_url or spec.backend.sim_target()

    def make_batch(config: EngineConfig, load_points: list[LoadPoint], repeats: Sequence[int],
                   baseline_run: int | None) -> PlannedBatch:
        lps = [(seed, r) for r in repeats for lp in load_points
               for seed in (rate_sweep_seeds(lp) if lp.rate_sweep else sla_first_round(lp) if lp.sla_search else [lp])]
        if spec.planner.randomize:
            rng.shuffle(lps)
        rung = 1.0 if baseline_run is not None else fidelity
        trials = tuple(
            TrialManifest(
                experiment=spec.name,
                model=ident,
                backend=backend,
                target=target,
                config_id=config.config_id,
                engine=config,
                load_point=at_fidelity(lp, rung),
                repeat=r,
                baseline_run=baseline_run,
                fidelity=rung,
            )
            for lp, r in lps
        )
        return PlannedBatch(index=-1, config=config, trials=trials, is_baseline=baseline_run is not None)

    # One batch (one server start) per (config, repeat); with restart_per_repeat false, one per config
    # holding all its repeats, their trials shuffled together under randomize.
    if spec.restart_per_repeat:
        work: list[tuple[EngineConfig, list[int]]] = [(c, [r]) for r in range(spec.repeats) for c in configs]
    else:
        work = [(c, list(range(spec.repeats))) for c in configs]
    if spec.planner.randomize:
        rng.shuffle(work)
    main = [make_batch(c, spec.load_points, rs, None) for c, rs in work]

    ordered: list[PlannedBatch] = []
    if spec.baseline is None:
        ordered = main
    else:
        bl = spec.baseline
        base_args = {**spec.engine.fixed.model_dump(exclude_none=True), **bl.engine.model_dump(exclude_none=True, exclude={"env"})}
        bl_config = EngineConfig(args=EngineArgs(**base_args), env={**spec.engine.env, **bl.engine.env})
        bl_lps = [lp for lp in spec.load_points if bl.load_points is None or lp.name in bl.load_points]
        run = 0
        ordered.append(make_batch(bl_config, bl_lps, [0], run))
        for i, batch in enumerate(main, start=1):
            ordered.append(batch)
            if i % bl.every_batches == 0 and i < len(main):
                run += 1
                ordered.append(make_batch(bl_config, bl_lps, [0], run))
        run += 1
        ordered.append(make_batch(bl_config, bl_lps, [0], run))
    targets: list[str | None] = list(spec.hardware.labels() if spec.hardware is not None else []) or [None]
    check = StartCheck(spec) if prune else None
    prune_notes = check.notes if check is not None else ()
    recorded: set[tuple[str, str | None]] = set()
    pruned: list[PrunedConfig] = []
    kept: list[tuple[PlannedBatch, str | None]] = []
    for b in ordered:
        for t in targets:
            reason = check.reason(b.config, t) if check is not None else None
            if reason is None:
                kept.append((b, t))
            elif (b.config_id, t) not in recorded:
                recorded.add((b.config_id, t))
                pruned.append(PrunedConfig(config=b.config, hardware_target=t, reason=reason,
                                           is_baseline=b.is_baseline))
    batches = tuple(
        PlannedBatch(index=i, config=b.config, trials=for_target(b.trials, target), is_baseline=b.is_baseline)
        for i, (b, target) in enumerate(kept)
    )
    return Plan(
        experiment=spec.name,
        batches=batches,
        design=design,
        randomized=spec.planner.randomize,
        seed=spec.planner.seed,
        notes=tuple(notes) + tuple(_sla_notes(spec)),
        followup_rates={lp.name: lp.rate_sweep.num_rates for lp in spec.load_points if lp.rate_sweep},
        pruned=tuple(pruned),
        prune_notes=prune_notes,
    )


def _sla_notes(spec: ExperimentSpec) -> list[str]:
    out = []
    for lp in spec.load_points:
        if lp.sla_search is not None:
            s = lp.sla_search
            n0 = len(first_rates(s.min_rps, s.max_rps, s.rates_per_round))
            out.append(f"SLA search {lp.name!r}: {n0} rate(s) planned per engine config and repeat; up to {s.max_rounds - 1} "
                       f"more round(s) of up to {s.rates_per_round} rate(s), one server start each, are decided "
                       "as results arrive (not in this estimate)")
    return out


def _fmt_duration(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 60} min {seconds % 60:02d} s" if seconds >= 60 else f"{seconds} s"
