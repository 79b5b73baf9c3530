"""Parameter importance side by side: ours (:func:`analysis.importance.importance`) vs Optuna's
fANOVA and PED-ANOVA evaluators, on the same planted datasets.

For each size ``n`` (configs drawn by :func:`analysis.synthetic.planted`, one trial each, random
design) and each seed, every tool ranks the parameters by their importance for the same target, the
log of ``output_throughput`` over the ok trials. Scored against the planted truth:

- **top-k = planted**: the k best-ranked parameters are exactly the k planted ones (fraction of seeds);
- **a no-effect parameter outranks a planted one**: fraction of seeds where any planted no-effect
  parameter is ranked above any planted important one; and the fraction of (planted, no-effect)
  pairs ordered wrongly, over all seeds;
- **no-effect flagged**: the fraction of (no-effect parameter, seed) pairs our importance calls
  "indistinguishable from noise" (its interval against the random probe); and, the other way, how
  often it says so of a planted parameter. Optuna returns point importances without intervals, so
  it has no such flag.

``gpu_memory_utilization`` (present from 4 parameters up) is neither: it has no planted effect on
throughput, but in the planted failure region (with large ``max_num_seqs``) trials fail, which
thins the fast configs among the ok trials, so it may legitimately carry a weak association.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from analysis.surrogate import clear_cache as clear_surrogates
from analysis.synthetic import planted
from benchmarks.analysis import optuna_side
from benchmarks.analysis.util import median, say, timed

OURS = "servetune (ours)"
TOOLS = (OURS, *optuna_side.EVALUATORS)


@dataclass
class ToolRun:
    """One tool on one dataset."""

    tool: str
    n_configs: int
    seed: int
    seconds: float
    n_trials: int  # ok trials the tool saw
    ranking: list[str]  # best first
    flagged_noise: list[str] | None  # None: the tool has no such flag
    scores: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


@dataclass
class ToolSummary:
    """One tool at one size, over the seeds."""

    tool: str
    n_configs: int
    seeds: int
    n_trials_median: float
    seconds_median: float
    seconds_min: float
    seconds_max: float
    topk_equal: float  # fraction of seeds
    null_outranks_planted: float  # fraction of seeds
    misordered_pairs: float  # fraction of (planted, null) pairs over all seeds
    null_flagged: tuple[int, int] | None  # (flagged, of)
    planted_flagged: tuple[int, int] | None
    planted_median_rank: dict[str, float]
    notes: list[str]


def ours(ds: Any, n_boot: int, seed: int) -> tuple[list[str], list[str], dict[str, float], int, list[str]]:
    """Our importance: (ranking best first, parameters flagged as noise, scores, ok trials used, notes)."""
    from analysis.importance import importance

    clear_surrogates()  # every timing pays for its surrogate fits (none reused)
    res = importance(ds, n_boot=n_boot, seed=seed)
    return _read_ours(res)


def _read_ours(res: Any) -> tuple[list[str], list[str], dict[str, float], int, list[str]]:
    rows = list(getattr(res, "params", None) or getattr(res, "parameters", None) or [])
    scores: dict[str, float] = {}
    flagged: list[str] = []
    for row in rows:
        name = str(row.name)
        perm = getattr(row, "permutation", None)
        est = getattr(perm, "estimate", math.nan) if perm is not None else math.nan
        scores[name] = float(est)
        if str(getattr(row, "verdict", "")) == "indistinguishable from noise":
            flagged.append(name)
    ranking = sorted(scores, key=lambda k: (-scores[k] if math.isfinite(scores[k]) else math.inf, k))
    n_used = int(getattr(res, "n_trials", 0) or 0)
    notes = [f"{c.code}: {c.message}" for c in getattr(res, "warnings", [])]
    notes += [f"subsampled {s.what}: {s.used} of {s.of}" for s in getattr(res, "subsampled", [])]
    return ranking, flagged, scores, n_used, notes


def run_one(n_configs: int, n_params: int, seed: int, n_boot: int, noise: float) -> tuple[list[ToolRun], Any]:
    """Every tool on ``planted(n_configs, n_params, seed=seed)``; returns the runs and the truth."""
    ds, truth = planted(n_configs=n_configs, n_params=n_params, noise=noise, seed=seed)
    runs: list[ToolRun] = []
    (ranking, flagged, scores, n_used, notes), secs = timed(lambda: ours(ds, n_boot, seed))
    runs.append(ToolRun(OURS, n_configs, seed, secs, n_used, ranking, flagged, scores, notes))
    study, build_s = timed(lambda: optuna_side.build_study(ds))
    for tool in optuna_side.EVALUATORS:
        res = optuna_side.evaluate(study, tool, seed=seed)
        runs.append(ToolRun(tool, n_configs, seed, res.seconds, res.n_trials, res.ranking, None, res.importances,
                            [f"study built in {build_s:.3f} s (not counted)"]))
    return runs, truth


def summarize(runs: Sequence[ToolRun], important: Sequence[str], null: Sequence[str]) -> ToolSummary:
    """Score one tool's runs at one size against the planted truth."""
    k = len(important)
    topk = outranks = 0
    pairs_bad = pairs = 0
    null_flag = [0, 0]
    planted_flag = [0, 0]
    ranks: dict[str, list[float]] = {p: [] for p in important}
    for r in runs:
        pos = {name: i + 1 for i, name in enumerate(r.ranking)}
        worst = len(r.ranking) + 1
        if set(r.ranking[:k]) == set(important):
            topk += 1
        bad_here = 0
        for a in important:
            for b in null:
                pairs += 1
                if pos.get(b, worst) < pos.get(a, worst):
                    bad_here += 1
        pairs_bad += bad_here
        outranks += bad_here > 0
        for a in important:
            ranks[a].append(float(pos.get(a, worst)))
        if r.flagged_noise is not None:
            null_flag[0] += sum(1 for b in null if b in r.flagged_noise)
            null_flag[1] += len(null)
            planted_flag[0] += sum(1 for a in important if a in r.flagged_noise)
            planted_flag[1] += len(important)
    n = len(runs)
    secs = [r.seconds for r in runs]
    notes = _note_counts([r.notes for r in runs])
    return ToolSummary(
        tool=runs[0].tool, n_configs=runs[0].n_configs, seeds=n, n_trials_median=median([r.n_trials for r in runs]),
        seconds_median=median(secs), seconds_min=min(secs), seconds_max=max(secs), topk_equal=topk / n,
        null_outranks_planted=outranks / n, misordered_pairs=pairs_bad / pairs if pairs else math.nan,
        null_flagged=(null_flag[0], null_flag[1]) if runs[0].flagged_noise is not None else None,
        planted_flagged=(planted_flag[0], planted_flag[1]) if runs[0].flagged_noise is not None else None,
        planted_median_rank={a: median(v) for a, v in ranks.items()}, notes=notes,
    )


def _note_counts(per_run: Sequence[Sequence[str]]) -> list[str]:
    """One line per kind of note (the text before the first digit), with how many runs had it."""
    seen: dict[str, tuple[str, int]] = {}
    for notes in per_run:
        for note in set(notes):
            if note.startswith("study built"):
                continue
            key = note.split(":", 1)[0]
            first, count = seen.get(key, (note, 0))
            seen[key] = (first, count + 1)
    return [f"{first} (in {count} of {len(per_run)} runs; the figures are one run's)" if count > 1
            else f"{first} (in 1 of {len(per_run)} runs)" for first, count in sorted(seen.values())]


def bench(sizes: Sequence[int] = (30, 500), seeds: int = 5, n_params: int = 8, n_boot: int = 100,
          noise: float = 0.05) -> dict[str, Any]:
    """The whole side-by-side; returns every run and the summaries (JSON-ready)."""
    all_runs: list[ToolRun] = []
    summaries: list[ToolSummary] = []
    say("importance: warm-up of every tool on a separate small dataset (imports, first calls; not counted)")
    run_one(30, n_params, 10_000, min(n_boot, 10), noise)
    truth = None
    total = len(sizes) * seeds
    step = 0
    for n in sizes:
        per_tool: dict[str, list[ToolRun]] = {t: [] for t in TOOLS}
        for seed in range(seeds):
            step += 1
            say(f"importance {step}/{total}: planted(n_configs={n}, n_params={n_params}, seed={seed})")
            runs, truth = run_one(n, n_params, seed, n_boot, noise)
            for r in runs:
                per_tool[r.tool].append(r)
                say(f"  {r.tool}: {r.seconds:.3f} s, ranking {', '.join(r.ranking)}"
                    + (f"; flagged as noise: {', '.join(r.flagged_noise) or 'none'}" if r.flagged_noise is not None
                       else ""))
            all_runs.extend(runs)
        assert truth is not None
        for tool in TOOLS:
            summaries.append(summarize(per_tool[tool], truth.important, truth.null))
    assert truth is not None
    from analysis.surrogate import DEFAULT_TREES

    return {
        "n_trees": DEFAULT_TREES, "sizes": list(sizes), "seeds": seeds, "n_params": n_params, "n_boot": n_boot, "noise": noise,
        "params": truth.params, "important": truth.important, "null": truth.null,
        "interaction": list(truth.interaction) if truth.interaction else None, "effects": truth.effects,
        "summaries": [asdict(s) for s in summaries], "runs": [asdict(r) for r in all_runs],
    }
