"""``python -m coordinator sweep CONFIG --preview``: the plan run on the simulator (SIMULATED), before GPU hours are spent.

The plan the sweep would run (:func:`coordinator.planning.plan_experiment`) is played, noiselessly,
on the simulated vLLM (:mod:`servetune.sim`) with the hardware profile of each of the spec's
targets, and the answer is what the sweep would find and cost: per load point the expected winner
under the spec's ranking policy and SLOs (:func:`servetune.ranking.rank`, the sweep's own rule),
the Pareto front of the objective against p99 TTFT, the configs that would not start (with vLLM's
wording), the number of server starts, and the wall-clock and GPU-hour cost. Every line says
SIMULATED and names the profile and its calibration. Nothing is written: the experiment folder is
never created or touched, so a preview can never mix with measured results.

Profiles: ``--profile`` wins; else ``backend.profile`` of a ``sim`` backend; else each hardware
target's profile (a class such as ``1xH100-80GB`` or a filter's ``gpu_model`` glob, matched against
the profile names); else ``cpu-tiny`` for the tiny model and ``H100-80G`` for any other model (said
on the console). The model shape: ``--model-shape``, ``backend.model_shape``, ``tiny`` for the tiny
model, or the one whose size (``8b``, ``70b``) the model's id or folder names.

Cost (assumptions, said on the console): a server start takes :data:`CPU_START_S` on the CPU
build (DESIGN.md's measured 44 s), :data:`GPU_START_BASE_S` plus the weights read at
:data:`WEIGHT_LOAD_BYTES_S` on a GPU; each trial adds :data:`TRIAL_OVERHEAD_S` to its simulated
duration (warm-up included); a config that fails still pays its start; GPU hours are the batch's
wall time times its ``tensor_parallel_size``. Repeats are planned and costed but simulated once
(noiseless repeats are identical). A rate sweep's ``@sync`` and ``@max`` seeds are played like any
load point, then the follow-up rates the sweep would choose from their simulated throughputs
(:func:`servetune.manifest.rate_sweep_next`, the sweep's rule), each ranked as its own load point
and costed as the sweep adds them: one more server start per batch and rate sweep. ``--json``
prints the same preview as one document (:mod:`coordinator.preview_json`).

The simulation runs in ``python -m daemon.sim_preview`` (a child process: the coordinator never
imports the daemon, whose request planning the simulator shares); no daemon and no server start.
"""

from __future__ import annotations

import fnmatch
import json
import math
import re
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from coordinator.planning import plan_experiment
from servetune.manifest import Plan, sweep_parent, swept_names
from servetune.ranking import RankedConfig, TrialSummary, rank
from servetune.sim.profiles import GIB, PROFILE_NAMES, SHAPE_NAMES, get_profile, get_shape
from servetune.spec import BackendSpec, ExperimentSpec, RankingPolicy

SIMULATED = "SIMULATED"
#: seconds one server start costs, by kind of profile (assumptions; see the module docstring)
CPU_START_S = 45.0
GPU_START_BASE_S = 60.0
WEIGHT_LOAD_BYTES_S = 2e9
TRIAL_OVERHEAD_S = 3.0
DEFAULT_GPU_PROFILE = "H100-80G"
DEFAULT_CPU_PROFILE = "cpu-tiny"
CHILD_TIMEOUT_S = 600.0
#: rows of a ranked table shown (the winner and front are always computed over every config)
MAX_ROWS = 12


class PreviewInputError(ValueError):
    """Bad input for a preview, naming the option or spec key (exit 2)."""


@dataclass(frozen=True)
class PreviewTarget:
    """One hardware profile the plan is previewed on: ``label`` is the spec's target label (None: no targets)."""

    label: str | None
    profile: str
    shape: str
    why: str


@dataclass
class TargetPreview:
    """What the sweep would find and cost on one target (every figure SIMULATED, noiseless)."""

    target: PreviewTarget
    calibration: str
    ranked: dict[str, list[RankedConfig]]
    fronts: dict[str, list[RankedConfig]]
    failures: dict[str, str]  # config label -> vLLM's reason
    server_starts: int
    wall_s: float
    gpu_hours: float
    cost_usd: float | None
    notes: list[str] = field(default_factory=list)
    #: trials the plan runs (repeats counted), and the follow-ups its rate sweeps would add
    trials: int = 0
    followup_trials: int = 0
    followup_starts: int = 0
    #: per config and rate sweep: ``config_id``, ``config_label``, ``load_point`` (the spec's), ``sync_rps``,
    #: ``max_rps`` and the follow-up ``rates`` the sweep would choose from them (empty: it adds none)
    rate_sweeps: list[dict[str, Any]] = field(default_factory=list)
    #: follow-up load point name -> the spec's rate-sweep load point it comes from
    followup_of: dict[str, str] = field(default_factory=dict)

    @property
    def is_gpu(self) -> bool:
        return get_profile(self.target.profile).kv_cache_bytes is None

    def heading(self) -> str:
        return f"{SIMULATED} [{self.target.profile}, {self.calibration}]"


def _match_profile(pattern: str, regex: bool = False) -> str | None:
    for name in PROFILE_NAMES:
        base = name.split("-")[0]
        if regex:
            if re.search(pattern, name, re.I) or re.search(pattern, base, re.I):
                return name
        elif fnmatch.fnmatch(name.lower(), pattern.lower()) or fnmatch.fnmatch(base.lower(), pattern.lower()):
            return name
    return None


def _class_profile(hardware_class: str) -> str | None:
    """The profile of a hardware class such as ``1xH100-80GB`` (one GPU model only), or None."""
    m = re.fullmatch(r"\d+x(.+?)-(\d+)GB", hardware_class)
    if m is None:
        return None
    model, mem_gb = m.group(1).upper(), int(m.group(2))
    for name in PROFILE_NAMES:
        p = get_profile(name)
        if p.kv_cache_bytes is None and name.split("-")[0].upper() == model and abs(p.memory_bytes / 1e9 - mem_gb) <= 0.1 * mem_gb:
            return name
    return None


def _shape_for(spec: ExperimentSpec, shape: str | None) -> tuple[str, str]:
    if shape is not None:
        if shape not in SHAPE_NAMES:
            raise PreviewInputError(f"--model-shape {shape!r} is not a sim model shape; shapes: {', '.join(SHAPE_NAMES)}")
        return shape, "--model-shape"
    if spec.backend.kind == "sim" and spec.backend.model_shape:
        return spec.backend.model_shape, "backend.model_shape"
    if spec.model.source == "tiny":
        return "tiny", "model.source: tiny"
    key, name = ("model.id", spec.model.id) if spec.model.source == "hub" else ("model.path", spec.model.path)
    size = re.findall(r"(?<![\d.])(\d+)[bB](?![a-zA-Z])", name or "")
    for candidate in SHAPE_NAMES:
        if size and candidate.endswith(f"-{size[-1]}b"):
            return candidate, f"{key} {name!r} names {size[-1]}B"
    raise PreviewInputError(f"{key} {name!r}: no sim model shape matches its name; pass --model-shape, one of "
                            f"{', '.join(SHAPE_NAMES)}")


def resolve_targets(spec: ExperimentSpec, profile: str | None = None, shape: str | None = None) -> list[PreviewTarget]:
    """The profiles to preview ``spec`` on (see the module docstring); :class:`PreviewInputError` naming the key."""
    shape_name, _ = _shape_for(spec, shape)
    if profile is not None:
        if profile not in PROFILE_NAMES:
            raise PreviewInputError(f"--profile {profile!r} is not a sim profile; profiles: {', '.join(PROFILE_NAMES)}")
        labels: list[str | None] = list(spec.hardware.labels()) if spec.hardware else [None]
        return [PreviewTarget(label, profile, shape_name, "--profile") for label in labels]
    if spec.backend.kind == "sim":
        name = spec.backend.profile or DEFAULT_CPU_PROFILE
        return [PreviewTarget(None, name, shape_name, "backend.profile" if spec.backend.profile else "backend sim default")]
    if spec.hardware is not None and spec.hardware.targets:
        out = []
        for i, t in enumerate(spec.hardware.targets):
            if t.hardware_class is not None:
                found, key = _class_profile(t.hardware_class), f"hardware.targets[{i}].hardware_class"
                what = t.hardware_class
            else:
                what = t.gpu_model_regex or t.gpu_model or ""
                key = f"hardware.targets[{i}].{'gpu_model_regex' if t.gpu_model_regex else 'gpu_model'}"
                found = _match_profile(what, regex=bool(t.gpu_model_regex)) if what else None
            if found is None:
                raise PreviewInputError(f"{key} {what!r}: no sim profile matches it; pass --profile, one of "
                                        f"{', '.join(PROFILE_NAMES)}")
            out.append(PreviewTarget(t.label, found, shape_name, f"{key} {what!r}"))
        return out
    if spec.model.source == "tiny":
        return [PreviewTarget(None, DEFAULT_CPU_PROFILE, shape_name, "the tiny model on the CPU build (default)")]
    return [PreviewTarget(None, DEFAULT_GPU_PROFILE, shape_name,
                          f"default: the spec names no hardware (--profile to choose one of {', '.join(PROFILE_NAMES)})")]


def _job(spec: ExperimentSpec, plan: Plan, target: PreviewTarget) -> dict[str, Any]:
    backend = BackendSpec(kind="sim", profile=target.profile, model_shape=target.shape, noise=False)
    batches = [b for b in plan.batches if b.hardware_target == target.label or target.label is None]
    configs = {b.config_id: b.config.model_dump(mode="json") for b in batches}
    seen: set[tuple[str, str]] = set()
    points = []
    for b in batches:
        for t in b.trials:
            key = (b.config_id, t.load_point.name)
            if key not in seen:
                seen.add(key)
                points.append({"config_id": b.config_id, "load_point": t.load_point.model_dump(mode="json")})
    return {"backend": backend.model_dump(mode="json"), "slos": [s.model_dump(mode="json") for s in spec.slos],
            "deadline_s": spec.budgets.trial_timeout_s, "drain_timeout_s": spec.budgets.drain_timeout_s,
            "configs": configs, "points": points, "tiny_model": spec.model.source == "tiny",
            "rate_sweeps": [lp.model_dump(mode="json") for lp in spec.load_points if lp.rate_sweep is not None]}


def simulate(jobs: Sequence[dict[str, Any]], timeout_s: float = CHILD_TIMEOUT_S) -> list[dict[str, Any]]:
    """Run ``python -m daemon.sim_preview`` on ``jobs``; its answer per job (RuntimeError when it fails)."""
    try:
        proc = subprocess.run([sys.executable, "-m", "daemon.sim_preview"], input=json.dumps({"targets": list(jobs)}),
                              capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"the simulator did not finish within {timeout_s:.0f} s") from None
    if proc.returncode != 0:
        raise RuntimeError(f"the simulator exited with code {proc.returncode}: {proc.stderr.strip()[-2000:]}")
    answer: list[dict[str, Any]] = json.loads(proc.stdout)["targets"]
    return answer


def pareto_front(rows: Sequence[RankedConfig], objective: str) -> list[RankedConfig]:
    """Configs with data that no other beats on both the objective (higher) and p99 TTFT (lower)."""
    pts: list[tuple[RankedConfig, float, float]] = []
    for r in rows:
        o, t = r.values.get(objective), r.values.get("ttft_p99_ms")
        if r.n_ok and o is not None and t is not None and not (math.isnan(o) or math.isnan(t)):
            pts.append((r, o, t))
    front = [r for r, o, t in pts if not any((o2 >= o and t2 <= t) and (o2 > o or t2 < t) for _, o2, t2 in pts)]
    return sorted(front, key=lambda r: -(r.values.get(objective) or 0.0))


def _start_s(target: PreviewTarget, tp: int) -> float:
    if get_profile(target.profile).kv_cache_bytes is not None:
        return CPU_START_S
    return GPU_START_BASE_S + get_shape(target.shape).weight_bytes / tp / WEIGHT_LOAD_BYTES_S


def build_preview(spec: ExperimentSpec, plan: Plan, target: PreviewTarget, answer: dict[str, Any]) -> TargetPreview:
    """Rank, front and cost of one target from the simulator's ``answer`` (see :mod:`daemon.sim_preview`).

    Rate sweeps: each batch whose config played both seeds gets the follow-up load points the
    simulator chose with the sweep's rule, as the sweep adds them: one more server start per batch
    and rate sweep, its trials ranked per load point like any other."""
    batches = [b for b in plan.batches if b.hardware_target == target.label or target.label is None]
    configs = {b.config_id: b.config for b in batches}
    swept = swept_names(configs.values()) or None
    by_point = {(p["config_id"], p["load_point"]): p for p in answer["points"] if "skipped" not in p}
    skipped = {p["load_point"]: p["skipped"] for p in answer["points"] if "skipped" in p}
    followups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for p in answer["points"]:
        if p.get("followup_of") and "skipped" not in p:
            followups.setdefault((p["config_id"], p["followup_of"]), []).append(p)
    summaries = []
    wall = gpu_h = 0.0
    followup_trials = followup_starts = 0
    for b in batches:
        tp = b.config.args.tensor_parallel_size or 1
        batch_s = _start_s(target, tp)
        err = answer["configs"][b.config_id].get("error")
        label = b.config.label(swept)
        for t in b.trials:
            p = by_point.get((b.config_id, t.load_point.name))
            if p is not None:
                batch_s += p["sim_s"] + TRIAL_OVERHEAD_S
            summaries.append(TrialSummary(
                trial_id=t.trial_id, config_id=b.config_id, config_label=label,
                load_point=t.load_point.name, status="failed" if err else ("ok" if p else "hole"),
                failure_kind="measurement" if err else None, metrics=p["metrics"] if p else {},
                is_baseline=b.is_baseline))
        for parent in dict.fromkeys(sweep_parent(t.load_point.name) for t in b.trials):
            points = followups.get((b.config_id, parent or ""), [])
            if not points:
                continue
            followup_starts += 1
            follow_s = _start_s(target, tp) + sum(p["sim_s"] + TRIAL_OVERHEAD_S for p in points)
            batch_s += follow_s
            followup_trials += len(points)
            summaries += [TrialSummary(trial_id=f"{b.index}:{p['load_point']}", config_id=b.config_id,
                                       config_label=label, load_point=p["load_point"], status="ok",
                                       failure_kind=None, metrics=p["metrics"], is_baseline=b.is_baseline)
                          for p in points]
        wall += batch_s
        gpu_h += batch_s * tp / 3600
    ranked = rank(summaries, spec.ranking)
    fronts = {lp: pareto_front(rows, spec.ranking.objective) for lp, rows in ranked.items()}
    failures = {configs[cid].label(swept): c["error"] for cid, c in answer["configs"].items() if c.get("error")}
    prices = spec.gpu_hour_prices
    price = prices.get(target.label) if target.label is not None else None
    prof = get_profile(target.profile)
    is_gpu = prof.kv_cache_bytes is None
    notes = [f"profile {target.profile} from {target.why}; model shape {target.shape}"]
    notes += [f"pruned before any trial (not simulated, no start paid): {p.config.label(swept)}"
              f"{' [baseline]' if p.is_baseline else ''}: {p.reason}"
              for p in plan.pruned if target.label is None or p.hardware_target == target.label]
    notes += [f"load point {lp} not simulated (a hole in the preview, not in the cost): {why}"
              for lp, why in skipped.items()]
    sweeps = [{**s, "config_label": configs[s["config_id"]].label(swept)} for s in answer.get("rate_sweeps", [])]
    for s in sweeps:
        if not s["rates"]:
            notes.append(f"rate sweep {s['load_point']} of {s['config_label']}: @max request throughput "
                         f"({s['max_rps']:.3g}/s) is not above @sync ({s['sync_rps']:.3g}/s), so the sweep adds no "
                         "follow-up load point")
    if followup_trials:
        notes.append(f"{followup_trials} rate-sweep follow-up trial(s) in {followup_starts} more server start(s), at "
                     "the rates the sweep would choose from the simulated @sync and @max throughputs (measured "
                     "ones will differ): simulated and in the cost")
    for lp in spec.load_points:
        if lp.sla_search is not None:
            notes.append(f"SLA search {lp.name}: only its first round's rates are simulated and costed; the rounds "
                         f"after it (up to {lp.sla_search.max_rounds - 1}, one server start each) follow measured "
                         "results and are not in this preview")
    if spec.repeats > 1:
        notes.append(f"{spec.repeats} repeats planned and costed; simulated once (noiseless repeats are identical)")
    if not is_gpu and prof.kv_cache_bytes:
        notes.append(f"CPU KV cache: VLLM_CPU_KVCACHE_SPACE GiB (unset: {prof.kv_cache_bytes / GIB:g} GiB)")
    return TargetPreview(target=target, calibration=answer["calibration"], ranked=ranked, fronts=fronts,
                         failures=failures, server_starts=len(batches) + followup_starts, wall_s=wall,
                         gpu_hours=gpu_h if is_gpu else 0.0,
                         cost_usd=gpu_h * price if (price is not None and is_gpu) else None,
                         notes=notes, trials=sum(len(b.trials) for b in batches), followup_trials=followup_trials,
                         followup_starts=followup_starts, rate_sweeps=sweeps,
                         followup_of={p["load_point"]: p["followup_of"] for p in answer["points"]
                                      if p.get("followup_of")})


def expected_winner(rows: Sequence[RankedConfig], policy: RankingPolicy) -> RankedConfig | None:
    """The config a sweep would pick at one load point: the top row if it has data and (when the
    policy requires it) meets every SLO; None when no config is expected to."""
    best = rows[0] if rows else None
    if best is not None and best.n_ok and (not policy.require_slos or best.slos_met is not False):
        return best
    return None


def preview(spec: ExperimentSpec, profile: str | None = None, shape: str | None = None) -> list[TargetPreview]:
    """The SIMULATED preview of ``spec``, one per target; writes nothing. :class:`PreviewInputError` on bad input."""
    if spec.backend.kind == "openai":
        raise PreviewInputError("backend.kind 'openai': the endpoint is not servetune's to configure, so there is "
                                "no engine config to simulate; --preview needs backend vllm or sim")
    targets = resolve_targets(spec, profile, shape)
    plan = plan_experiment(spec)
    answers = simulate([_job(spec, plan, t) for t in targets])
    return [build_preview(spec, plan, t, a) for t, a in zip(targets, answers)]


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:,.{digits}f}"


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


def _status(r: RankedConfig) -> str:
    return r.status if not r.failure else f"would fail ({r.failure})"


def _slos(r: RankedConfig) -> str:
    return "-" if r.slos_met is None else ("met" if r.slos_met else "missed")


def print_preview(spec: ExperimentSpec, previews: Sequence[TargetPreview], console: Console) -> None:
    """The preview for a person: every table and line labelled SIMULATED with its profile."""

    def say(text: str) -> None:
        console.print(text, markup=False, highlight=False)

    objective = spec.ranking.objective
    slo_text = "; ".join(f"{s.metric} p{s.percentile:g} <= {s.max_ms:g} ms" for s in spec.slos) or "none"
    say(f"{SIMULATED} preview of {spec.name}: noiseless expected values from the simulated vLLM, not "
                  "measurements; no server was started and nothing was written")

    def verdict(pv: TargetPreview, lp: str, rows: Sequence[RankedConfig]) -> None:
        best = expected_winner(rows, spec.ranking)
        if best is not None:
            say(f"{SIMULATED} expected winner at {lp} on {pv.target.profile}: {best.config_label} "
                f"({_fmt(best.values.get(objective))} {objective})")
        else:
            rest = rows[0] if rows and rows[0].n_ok else None
            say(f"{SIMULATED} at {lp} on {pv.target.profile}: no config is expected to meet every SLO"
                + (f"; best of the rest: {rest.config_label}" if rest is not None else ""))
        front_text = ", ".join(f"{r.config_label} ({_fmt(r.values.get(objective))}, "
                               f"{_fmt(r.values.get('ttft_p99_ms'))} ms)" for r in pv.fronts.get(lp, []))
        say(f"{SIMULATED} front ({objective} vs TTFT p99) at {lp}: {front_text or 'none'}")

    for pv in previews:
        where = f" for hardware target {pv.target.label}" if pv.target.label else ""
        say(f"\n{pv.heading()}{where}: model shape {pv.target.shape}")
        for lp, rows in pv.ranked.items():
            if lp in pv.followup_of:
                continue
            front = {r.config_id for r in pv.fronts.get(lp, [])}
            table = Table(title=escape(f"{SIMULATED} {pv.target.profile} load point {lp}: ranked by {objective}"),
                          caption=escape(f"SLOs: {slo_text}; {pv.calibration}"))
            for col in ("rank", "engine config", "out tok/s", "req/s", "TTFT p99", "TPOT p99", "SLOs", "front", "status"):
                table.add_column(col)
            for r in rows[:MAX_ROWS]:
                v = r.values
                table.add_row(str(r.rank), escape(r.config_label), _fmt(v.get("output_throughput")),
                              _fmt(v.get("request_throughput"), 2), _fmt(v.get("ttft_p99_ms")),
                              _fmt(v.get("tpot_p99_ms")), _slos(r), "*" if r.config_id in front else "", _status(r))
            console.print(table)
            if len(rows) > MAX_ROWS:
                say(f"({len(rows) - MAX_ROWS} more configs not shown)")
            verdict(pv, lp, rows)
        for parent in dict.fromkeys(s["load_point"] for s in pv.rate_sweeps):
            followups = [lp for lp, of in pv.followup_of.items() if of == parent and lp in pv.ranked]
            if followups:
                table = Table(title=escape(f"{SIMULATED} {pv.target.profile} rate sweep {parent}: the follow-up load "
                                           "points the sweep would add"),
                              caption=escape(f"rates from the simulated @sync and @max throughputs; SLOs: {slo_text}; "
                                             f"{pv.calibration}"))
                for col in ("load point", "rank", "engine config", "out tok/s", "req/s", "TTFT p99", "TPOT p99",
                            "SLOs"):
                    table.add_column(col)
                for lp in followups:
                    for r in pv.ranked[lp]:
                        v = r.values
                        table.add_row(escape(lp), str(r.rank), escape(r.config_label),
                                      _fmt(v.get("output_throughput")), _fmt(v.get("request_throughput"), 2),
                                      _fmt(v.get("ttft_p99_ms")), _fmt(v.get("tpot_p99_ms")), _slos(r))
                console.print(table)
            for lp in followups:
                verdict(pv, lp, pv.ranked[lp])
        for label, reason in pv.failures.items():
            say(f"{SIMULATED} would not start on {pv.target.profile}: {label}: {reason}")
        cost = f"; ${pv.cost_usd:,.2f} at the spec's price" if pv.cost_usd is not None else ""
        gpu = (f"{pv.gpu_hours:.2f} GPU-hours{cost}" if pv.is_gpu else "no GPU-hours (CPU profile)")
        start = ("server start assumed " + (f"{CPU_START_S:g} s" if not pv.is_gpu else
                 f"{GPU_START_BASE_S:g} s + weights at {WEIGHT_LOAD_BYTES_S / 1e9:g} GB/s"))
        follow = (f" ({pv.followup_starts} for {pv.followup_trials} rate-sweep follow-up trials)"
                  if pv.followup_starts else "")
        say(f"{SIMULATED} cost on {pv.target.profile}: {pv.server_starts} server starts{follow}, about "
            f"{_duration(pv.wall_s)} wall-clock, {gpu} ({start}, {TRIAL_OVERHEAD_S:g} s per trial)")
        for note in pv.notes:
            say(f"note: {note}")
    say(f"{SIMULATED}: a preview is a model's expectation, never a measurement: measure before deciding")


def run_preview(spec: ExperimentSpec, profile: str | None, shape: str | None, as_json: bool = False) -> int:
    """The ``--preview`` command: print the preview (``as_json``: the JSON document of
    :mod:`coordinator.preview_json`, whole or nothing on stdout); 2 on bad input (naming the key),
    1 if the simulator fails."""
    from coordinator.summary import output_console
    from servetune.exitcodes import ExitCode

    try:
        previews = preview(spec, profile, shape)
    except PreviewInputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return int(ExitCode.USAGE)
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if as_json:
        from coordinator.preview_json import preview_document, write_document

        write_document(preview_document(spec, previews))
    else:
        print_preview(spec, previews, output_console())
    return 0
