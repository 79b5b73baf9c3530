"""Failure probability by parameter region: Wilson intervals per region and a logistic model.

What counts as a failure
    Every failed trial carries a ``failure_kind`` and the kinds are never pooled:

    ``measurement``
        the config itself failed: out of memory, the server would not start, it died under load.
        This is THE config failure and what the model describes by default (``kinds``).
    ``config``, ``parse``
        the config was rejected before it ran, or its result could not be read.
    ``transport``
        the daemon or the connection to it was lost: not a property of the config.

    Each kind is counted and reported on its own (:attr:`FailureResult.by_kind`). Trials that
    failed with a kind *not* in ``kinds`` are left out of the regional rates and the model (their
    outcome for the modelled kind is unknown, so they are neither failures nor successes); holes
    (status ``hole``: planned, never run) are not failures either and are only counted. Baseline
    re-runs (``is_baseline``) are drift controls of a single config and are left out.

Groups
    Hardware classes are analysed separately (a config that fits one GPU may not fit another):
    :attr:`FailureResult.groups` holds one :class:`FailureGroup` per hardware class. Trials at
    every load point are pooled unless ``load_point`` picks one (each trial is one Bernoulli
    observation of the config).

Regions
    Cells of the swept parameters' levels. A parameter with at most ``max_bins`` (4) levels keeps
    its levels; a numeric one with more is cut into at most ``max_bins`` bins of whole levels with
    roughly equal trial counts (quantile bins), or at the cut points the caller gives (``cuts``);
    a config that leaves a parameter at vLLM's default falls in the region ``default``. Regions
    are every single parameter's cells, then the cells of parameter pairs, pairs taken in order of
    their failure-rate spread (highest cell rate minus lowest, over cells with at least
    ``_MIN_CELL`` trials) while the total stays within ``max_regions``; the output says how many
    pairs were examined of how many (:attr:`FailureResult.subsampled`). Each region reports its
    trials, failures and the rate with a Wilson score interval.

Model
    A main-effects logistic regression (statsmodels ``Logit``) of failure on the parameters:
    numeric parameters encoded as in :func:`analysis.frame.design_matrix` (log2 for wide ranges)
    and standardised, so each coefficient is the change in log-odds per standard deviation of the
    (encoded) parameter; bool parameters as 0/1; categorical ones as indicators against their first
    level; a config left at vLLM's default as an indicator ``<name>=default``. Coefficients carry
    Wald intervals; each region gets the model's mean predicted probability over its trials with a
    parametric-simulation interval (coefficient draws from their estimated sampling distribution).
    To the main effects the model may add up to two terms a tree would find (:func:`_candidates`:
    a parameter past a threshold, two parameters past thresholds at once, i.e. a corner such as
    OOM at high memory utilisation with many sequences, or a product of two terms), each chosen by
    a score test that must pass a Bonferroni screen over every candidate (caveat ``failure_terms``
    names them): a failure corner is then modelled rather than averaged away.

    The model is dropped, and the regional Wilson intervals are the answer, when it cannot mean
    anything: too few events (fewer than 5 failures or 5 successes, or under 10 events per model
    term, where its regional intervals under-cover in simulation: caveat ``few_events``), or separation /
    quasi-separation (caveat ``separation``): statsmodels reports perfect prediction, the fit does
    not converge, a coefficient or its standard error is huge (|b| > 10 or SE > 10 per standard
    deviation), or a region with no or only failures is predicted at 0 or 1. Where a region's failure
    count departs from the model's prediction beyond the uncertainty of both (:func:`_misfit`),
    caveat ``model_misfit`` says the model misses that region (a structure it lacks, most likely).

Caveat ``clustered``: when trials of one config all fail or all succeed more often than independent
repeats would, given the regions' failure rates (see :func:`_clustered`), the trials are not
independent and the intervals (which treat them as such) are too narrow; the config is then the
effective unit of replication.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

from analysis.common import Caveat, Claim, Interval, Notes, Subsample, claim_for, context_of
from analysis.frame import AnalysisInputError, Parameter, parameters, trial_table
from analysis.hardware import select_failover

log = logging.getLogger(__name__)

FAILURE_KINDS: tuple[str, ...] = ("measurement", "config", "parse", "transport")
UNKNOWN_KIND = "unknown"
_MIN_CELL = 5
_COEF_LIMIT = 10.0
_SE_LIMIT = 10.0
_EXTREME = 1e-6
_N_DRAWS = 500


@dataclass(frozen=True)
class KindCount:
    """Failures of one ``kind`` among ``of`` trials that ran (holes excluded), with a Wilson
    interval of the rate; ``modelled`` says whether the regions and the model count this kind."""

    kind: str
    failures: int
    of: int
    rate: Interval
    modelled: bool


@dataclass(frozen=True)
class RegionRate:
    """One region (a cell of one or two parameters' levels or bins).

    ``params`` and ``levels`` name it (``levels[i]`` is the label of ``params[i]``'s level or bin);
    ``n`` trials in it, ``failures`` of the modelled kinds; ``rate`` the observed proportion with its
    Wilson interval; ``predicted`` the logistic model's mean probability over the region's trials
    with its interval (None when the model was not fitted or fell back); ``statement`` one sentence
    in the wording the design allows."""

    params: tuple[str, ...]
    levels: tuple[str, ...]
    n: int
    failures: int
    rate: Interval
    predicted: Interval | None
    statement: str

    @property
    def label(self) -> str:
        return ", ".join(_region_part(p, v) for p, v in zip(self.params, self.levels))


@dataclass(frozen=True)
class Coefficient:
    """A logistic-model term: change in log-odds of failure ``per`` unit (Wald interval) and the
    corresponding odds ratio."""

    term: str
    per: str
    log_odds: Interval
    odds_ratio: Interval
    p_value: float


@dataclass(frozen=True)
class FailureGroup:
    """The failure analysis of one hardware class (and the load point, or ``"all"`` pooled).

    ``n`` trials modelled (ran, not baseline, failed only with a modelled kind if at all),
    ``failures`` among them; ``model`` is ``"logit"`` (fitted and used), ``"fallback"`` (fitted but
    meaningless: the regional intervals are the answer) or ``"none"`` (not fitted: too few events
    or nothing to model); ``coefficients`` only when ``model == "logit"``."""

    hardware_class: str
    load_point: str
    n: int
    failures: int
    rate: Interval
    by_kind: list[KindCount]
    regions: list[RegionRate]
    model: str
    coefficients: list[Coefficient]


@dataclass(frozen=True)
class FailureResult:
    """Failure probability by parameter region (see the module docstring).

    ``kinds`` modelled; ``by_kind`` counts over every analysed trial when they are of one hardware
    class, and is empty with several (each group's ``by_kind`` counts its class; a caveat lists them:
    counts of two classes are never pooled); ``n_holes``
    holes and ``n_baseline`` baseline trials left out; ``groups`` one per hardware class."""

    kinds: tuple[str, ...]
    level: float
    n_trials: int
    n_holes: int
    n_baseline: int
    by_kind: list[KindCount]
    groups: list[FailureGroup]
    claim: Claim
    warnings: list[Caveat] = field(default_factory=list)
    subsampled: list[Subsample] = field(default_factory=list)


def wilson_interval(failures: int, n: int, level: float = 0.95) -> Interval:
    """The Wilson score interval for a binomial proportion ``failures / n`` at ``level``.

    Args:
        failures: number of events (0..n).
        n: number of trials; with 0 the interval is NaN.
        level: two-sided confidence level.
    Returns:
        :class:`Interval` with the observed proportion as estimate.
    """
    if n <= 0:
        return Interval(math.nan, math.nan, math.nan, level)
    if not 0 <= failures <= n:
        raise AnalysisInputError(f"failures must be within 0..n, got {failures} of {n}")
    z = NormalDist().inv_cdf(1 - (1 - level) / 2)
    p = failures / n
    z2 = z * z
    denom = 1 + z2 / n
    centre = (p + z2 / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / denom
    low = 0.0 if failures == 0 else max(0.0, centre - half)
    high = 1.0 if failures == n else min(1.0, centre + half)
    return Interval(p, low, high, level)


def failure_probability(
    ds: xr.Dataset,
    params: Sequence[str] | None = None,
    load_point: str | None = None,
    kinds: Sequence[str] | None = None,
    level: float = 0.95,
    max_regions: int = 64,
    seed: int = 0,
    max_bins: int = 4,
    cuts: Mapping[str, Sequence[float]] | None = None,
    include_failover: bool = True,
) -> FailureResult:
    """Failure probability by parameter region, per hardware class, with failure kinds kept apart.

    Args:
        ds: an experiment's dataset (:mod:`servetune.schema`).
        params: parameters to analyse (default: every swept parameter).
        load_point: analyse this load point only (default: all load points pooled).
        kinds: failure kinds that count as failures (default ``("measurement",)``); one of
            ``measurement``, ``config``, ``parse``, ``transport`` or ``unknown`` (no kind recorded).
        level: confidence level of every interval.
        max_regions: cap on the number of regions per group (single-parameter cells first, then
            pairs by failure-rate spread).
        seed: seeds the coefficient draws behind the model's regional intervals.
        max_bins: numeric parameters with more levels are cut into this many quantile bins.
        cuts: explicit cut points for numeric parameters (``{"max_num_seqs": [128]}`` gives the
            regions ``< 128`` and ``>= 128``).
        include_failover: keep failover trials (tag ``failover-from:...``, with a caveat) or leave
            them out (:mod:`analysis.hardware`).
    Returns:
        :class:`FailureResult`.
    Raises:
        AnalysisInputError: an unknown parameter, kind or load point, or a bad level.
    """
    if not 0 < level < 1:
        raise AnalysisInputError(f"level must be in (0, 1), got {level!r}")
    if max_regions < 1:
        raise AnalysisInputError(f"max_regions must be positive, got {max_regions!r}")
    known_kinds = (*FAILURE_KINDS, UNKNOWN_KIND)
    chosen_kinds = tuple(kinds) if kinds is not None else ("measurement",)
    for k in chosen_kinds:
        if k not in known_kinds:
            raise AnalysisInputError(f"unknown failure kind {k!r}; known: {', '.join(known_kinds)}")
    if not chosen_kinds:
        raise AnalysisInputError("kinds is empty: name at least one failure kind to model")
    plist = parameters(ds, params)
    cuts = dict(cuts or {})
    by_name = {p.name: p for p in plist}
    for name in cuts:
        if name not in by_name:
            raise AnalysisInputError(f"cuts given for {name!r}, which is not an analysed parameter")
        if by_name[name].kind != "numeric":
            raise AnalysisInputError(f"cuts given for {name!r}, which is not numeric")

    notes = Notes()
    ds, _, _ = select_failover(ds, None, include_failover, notes)
    df = trial_table(ds)
    if load_point is not None:
        lps = set(df["load_point"].astype(str)) if "load_point" in df else set()
        if load_point not in lps:
            raise AnalysisInputError(f"unknown load_point {load_point!r}; the dataset has: {', '.join(sorted(lps))}")
        df = df[df["load_point"].astype(str) == load_point]
    is_baseline = df["is_baseline"].astype(bool).to_numpy() if "is_baseline" in df else np.zeros(len(df), bool)
    n_baseline = int(is_baseline.sum())
    df = df[~is_baseline]
    status = df["status"].astype(str).to_numpy()
    n_holes = int((status == "hole").sum())
    ran = df[status != "hole"].copy()
    ran["_kind"] = _kinds(ran)
    if n_holes:
        notes.warn("holes", f"{n_holes} planned trial(s) never ran (holes); they are not failures and are left out")

    claim = claim_for(ds)
    hw_col = ran["hardware_class"].astype(str) if "hardware_class" in ran else pd.Series("", index=ran.index)
    classes = sorted(set(hw_col)) if len(ran) else []
    multi = len(classes) > 1
    if multi:  # counts by kind are per class (each group's by_kind), never pooled across hardware classes
        by_kind: list[KindCount] = []
        for hw in classes:
            _kind_caveats(ran[hw_col == hw], chosen_kinds, notes, f"hardware_class={hw}")
    else:
        by_kind = _kind_counts(ran, chosen_kinds, level)
        _kind_caveats(ran, chosen_kinds, notes)

    groups: list[FailureGroup] = []
    for hw in classes:
        sub = ran[hw_col == hw]
        groups.append(_group(ds, sub, hw, load_point, plist, chosen_kinds, level, max_regions, max_bins, cuts,
                             seed, claim, notes, multi=multi))
    if multi:
        per_class = "; ".join(f"{g.hardware_class}: " + ", ".join(f"{k.kind} {k.failures}/{k.of}" for k in g.by_kind)
                              for g in groups)
        notes.warn("by_kind_per_class", f"{len(classes)} hardware classes: failures by kind are counted per class, "
                                        f"never pooled across them ({per_class}); the overall by_kind is left empty")
    if not len(ran):
        notes.warn("no_trials", "no trial ran (after leaving out holes and baselines): nothing to analyse")
    return FailureResult(
        kinds=chosen_kinds, level=level, n_trials=len(ran), n_holes=n_holes, n_baseline=n_baseline,
        by_kind=by_kind, groups=groups, claim=claim, warnings=notes.warnings, subsampled=notes.subsampled,
    )


# ---------------------------------------------------------------- kinds


def _kinds(df: pd.DataFrame) -> np.ndarray:
    """Per trial: "" for ok, else its failure kind ("unknown" when none was recorded)."""
    status = df["status"].astype(str).to_numpy()
    kind = df["failure_kind"].astype(str).to_numpy() if "failure_kind" in df else np.full(len(df), "")
    out = np.where(status == "failed", np.where(kind == "", UNKNOWN_KIND, kind), "")
    return out.astype(object)


def _kind_counts(ran: pd.DataFrame, kinds: tuple[str, ...], level: float) -> list[KindCount]:
    present = [str(k) for k in ran["_kind"].tolist() if k]
    names = list(FAILURE_KINDS) + sorted(set(present) - set(FAILURE_KINDS))
    out = []
    for k in names:
        count = sum(1 for v in present if v == k)
        out.append(KindCount(k, count, len(ran), wilson_interval(count, len(ran), level), k in kinds))
    return out


def _kind_caveats(ran: pd.DataFrame, kinds: tuple[str, ...], notes: Notes, subject: str = "") -> None:
    """A caveat per failure kind not modelled; ``subject``: the hardware class they count in (several classes)."""
    present = [str(k) for k in ran["_kind"].tolist() if k]
    other = sorted({k for k in present if k not in kinds})
    where = f" on {subject.split('=', 1)[1]}" if subject else ""
    for k in other:
        count = sum(1 for v in present if v == k)
        why = {"transport": "the daemon or its connection was lost, which says nothing about the config",
               UNKNOWN_KIND: "no failure kind was recorded"}.get(k, "not a modelled kind")
        notes.warn(f"excluded_{k}", f"{count} trial(s){where} failed with kind {k!r} ({why}); they are counted apart "
                                    "and left out of the regional rates and the model", subject=subject or k)


# ---------------------------------------------------------------- regions


@dataclass(frozen=True)
class _Factor:
    """A parameter turned into region labels, one per trial."""

    param: Parameter
    labels: np.ndarray


def _fmt(v: Any) -> str:
    if isinstance(v, (bool, np.bool_)):
        return str(bool(v))
    if isinstance(v, (int, float, np.integer, np.floating)):
        return f"{float(v):g}"
    return str(v)


def _factor(p: Parameter, values: np.ndarray, max_bins: int, cuts: Sequence[float] | None) -> _Factor:
    labels = np.full(len(values), "default", dtype=object)
    if p.kind != "numeric":
        for i, v in enumerate(values.tolist()):
            if not _is_missing(v):
                labels[i] = _fmt(bool(v) if p.kind == "bool" and not isinstance(v, str) else v)
        return _Factor(p, labels)
    num = pd.to_numeric(pd.Series(values), errors="coerce").to_numpy(dtype=float)
    ok = np.isfinite(num)
    if cuts is not None:
        edges = sorted(float(c) for c in cuts)
        idx = np.searchsorted(edges, num[ok], side="right")
        names = [f"< {edges[0]:g}"] + [f"[{a:g}, {b:g})" for a, b in zip(edges[:-1], edges[1:])] + [f">= {edges[-1]:g}"]
        labels[ok] = [names[i] for i in idx]
        return _Factor(p, labels)
    levels, counts = np.unique(num[ok], return_counts=True)
    if len(levels) <= max_bins:
        labels[ok] = [_fmt(v) for v in num[ok]]
        return _Factor(p, labels)
    # whole levels into at most max_bins bins of roughly equal trial counts
    target = counts.sum() / max_bins
    bin_of = np.zeros(len(levels), dtype=int)
    b, acc = 0, 0.0
    for i, c in enumerate(counts):
        if acc >= target * (b + 1) and b < max_bins - 1:
            b += 1
        bin_of[i] = b
        acc += c
    names = []
    for j in range(b + 1):
        members = levels[bin_of == j]
        names.append(_fmt(members[0]) if len(members) == 1 else f"[{members[0]:g}, {members[-1]:g}]")
    lookup = {float(v): names[bin_of[i]] for i, v in enumerate(levels)}
    labels[ok] = [lookup[float(v)] for v in num[ok]]
    return _Factor(p, labels)


def _is_missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v)) or (isinstance(v, str) and v == "")


def _cells(labels: list[np.ndarray]) -> dict[tuple[str, ...], np.ndarray]:
    """Trial indices of every observed combination of the labels, in a readable order."""
    frame = pd.DataFrame({i: lab.astype(str) for i, lab in enumerate(labels)})
    grouped = frame.groupby(list(frame.columns), sort=False).indices
    out = {(tuple(str(v) for v in key) if isinstance(key, tuple) else (str(key),)): np.asarray(idx, dtype=int)
           for key, idx in grouped.items()}
    return dict(sorted(out.items(), key=lambda kv: _sort_key(kv[0])))


def _sort_key(key: tuple[str, ...]) -> tuple[Any, ...]:
    out: list[Any] = []
    for s in key:
        head = s.lstrip("[<>= ").split(",")[0].rstrip(")]")
        try:
            out.append((0, float(head), s))
        except ValueError:
            out.append((1, 0.0, s))
    return tuple(out)


def _spread(cells: dict[tuple[str, ...], np.ndarray], y: np.ndarray) -> float:
    rates = [float(y[idx].mean()) for idx in cells.values() if len(idx) >= _MIN_CELL]
    return max(rates) - min(rates) if len(rates) >= 2 else 0.0


# ---------------------------------------------------------------- one group


def _group(ds: xr.Dataset, sub: pd.DataFrame, hw: str, load_point: str | None, plist: list[Parameter],
           kinds: tuple[str, ...], level: float, max_regions: int, max_bins: int,
           cuts: dict[str, Sequence[float]], seed: int, claim: Claim, notes: Notes, multi: bool) -> FailureGroup:
    subject = f"hardware_class={hw}" if multi else ""
    kind = sub["_kind"].to_numpy()
    keep = np.array([k == "" or k in kinds for k in kind.tolist()], dtype=bool)
    data = sub[keep]
    y = np.array([k in kinds for k in data["_kind"].tolist()], dtype=float)
    n, fails = len(data), int(y.sum())
    lp_label = load_point if load_point is not None else "all"
    by_kind = _kind_counts(sub, kinds, level)
    ctx = context_of(ds, load_point)
    if multi:
        ctx = type(ctx)(hw, ctx.model, ctx.vllm_version, ctx.workload)

    factors = []
    for p in plist:
        f = _factor(p, data[p.column].to_numpy(), max_bins, cuts.get(p.name))
        if len(set(f.labels.tolist())) > 1:
            factors.append(f)
    if not factors:
        notes.warn("no_regions", "no analysed parameter varies among these trials: only the overall rate is reported",
                   subject)

    regions: list[tuple[tuple[str, ...], tuple[str, ...], np.ndarray]] = []
    singles = [(f, _cells([f.labels])) for f in factors]
    singles.sort(key=lambda fc: -_spread(fc[1], y))
    kept_singles = 0
    for f, cells in singles:
        if len(regions) + len(cells) > max_regions:
            continue
        kept_singles += 1
        regions.extend(((f.param.name,), key, idx) for key, idx in cells.items())
    if kept_singles < len(singles):
        notes.warn("regions_capped", f"{len(singles) - kept_singles} parameter(s) left out of the regions to stay "
                                     f"within max_regions={max_regions}", subject)
    pairs = []
    for i in range(len(factors)):
        for j in range(i + 1, len(factors)):
            cells = _cells([factors[i].labels, factors[j].labels])
            pairs.append((_spread(cells, y), factors[i], factors[j], cells))
    pairs.sort(key=lambda t: -t[0])
    used_pairs = 0
    for _, fa, fb, cells in pairs:
        if len(regions) + len(cells) > max_regions:
            continue
        used_pairs += 1
        regions.extend(((fa.param.name, fb.param.name), key, idx) for key, idx in cells.items())
    _clustered(data, y, _partitions(factors, data, cuts), notes, subject)
    if pairs and used_pairs < len(pairs):
        notes.subsample(f"parameter pairs shown as regions{' (' + subject + ')' if subject else ''}, "
                        "by failure-rate spread", used_pairs, len(pairs))
        if used_pairs:
            notes.warn("selected_pairs", f"the {used_pairs} pair(s) of parameters shown as regions were chosen from "
                                         f"{len(pairs)} for their observed failure-rate spread, so their cells' "
                                         "intervals may cover less often than stated (about 90% for 95% in a "
                                         "simulation with no real pair structure; single-parameter regions 95%)",
                       subject)

    model, coefs, predicted, checks = _model(data, y, [f.param for f in factors], regions, level, seed, notes,
                                             subject)
    out_regions = []
    for names, key, idx in regions:
        rate = wilson_interval(int(y[idx].sum()), len(idx), level)
        pred = predicted.get((names, key)) if model == "logit" else None
        out_regions.append(RegionRate(names, key, len(idx), int(y[idx].sum()), rate, pred,
                                      _statement(names, key, int(y[idx].sum()), len(idx), rate, kinds, claim,
                                                 ctx.words())))
    if model == "logit":
        _misfit(out_regions, checks, notes, subject)
    return FailureGroup(hw, lp_label, n, fails, wilson_interval(fails, n, level), by_kind, out_regions, model, coefs)


def _region_part(param: str, label: str) -> str:
    """``max_num_seqs >= 128``, ``max_num_seqs in [4, 8]``, ``dtype=float16``."""
    if label[:1] in "<>":
        return f"{param} {label}"
    if label[:1] == "[":
        return f"{param} in {label}"
    return f"{param}={label}"


def _statement(names: tuple[str, ...], key: tuple[str, ...], fails: int, n: int, rate: Interval,
               kinds: tuple[str, ...], claim: Claim, where: str) -> str:
    region = " and ".join(_region_part(p, v) for p, v in zip(names, key))
    what = "/".join(kinds)
    pct = f"{rate.estimate:.0%} [{rate.low:.0%}, {rate.high:.0%}]"
    if claim.kind == "effect":
        return (f"setting {region} gave a {what} failure probability of {pct} ({fails} of {n} trials) {where}")
    return (f"trials with {region} failed ({what}) at {pct} ({fails} of {n}) {where} "
            f"(an association, not an effect: {claim.why})")


_PRIOR_TRIALS = 2.0  # pseudo-trials at the pooled rate that steady a leave-config-out cell rate
_CLUSTER_Z = NormalDist().inv_cdf(0.99)  # one-sided test of "fewer mixed configs than independence predicts"
_PLAUSIBLE_LOGLIK = 3.0  # partitions within this much held-out log-likelihood of the best are plausible

def _partitions(factors: list[_Factor], data: pd.DataFrame,
                cuts: dict[str, Sequence[float]]) -> list[tuple[str, np.ndarray]]:
    """Candidate partitions of the trials for :func:`_clustered`, as cell codes per trial: every
    parameter's regions and its raw levels, and every pair of those (binned with binned, raw with raw)."""
    binned = [(f.param.name, pd.factorize(f.labels.astype(str))[0]) for f in factors]
    raw = []
    for f, (name, codes_binned) in zip(factors, binned):
        lab = _factor(f.param, data[f.param.column].to_numpy(), 10**9, cuts.get(f.param.name)).labels
        codes = pd.factorize(lab.astype(str))[0]
        raw.append((f"{name} (levels)" if codes.max() > codes_binned.max() else name, codes))
    out: list[tuple[str, np.ndarray]] = []
    for family in (binned, raw):
        if family is raw and all(a[0] == b[0] for a, b in zip(binned, raw)):
            break  # no parameter was binned: the raw levels are the regions
        out += [part for k, part in enumerate(family) if family is binned or part[0] != binned[k][0]]
        for i in range(len(family)):
            for j in range(i + 1, len(family)):
                (na, a), (nb, b) = family[i], family[j]
                if family is raw and na == binned[i][0] and nb == binned[j][0]:
                    continue  # neither was binned: already a pair of regions
                out.append((f"{na} x {nb}", pd.factorize(a * (int(b.max()) + 1) + b)[0]))
    return out


def _clustered(data: pd.DataFrame, y: np.ndarray, partitions: list[tuple[str, np.ndarray]], notes: Notes,
               subject: str) -> None:
    """Warn when failures are all-or-nothing per config beyond what the regions explain.

    Under independence given each config's failure probability ``p_c``, a config with ``m`` repeats
    has mixed outcomes with probability ``q_c = 1 - p_c^m - (1 - p_c)^m``; the number of mixed
    configs then has mean ``sum q_c`` and variance ``sum q_c (1 - q_c)``. ``p_c`` is the
    leave-this-config-out failure rate of its cell (steadied by :data:`_PRIOR_TRIALS` pseudo-trials
    at the leave-out pooled rate), in the partition of the trials (pooled, one parameter's regions or
    a pair's, binned or at raw levels) that predicts held-out configs well (leave-one-config-out
    log-likelihood within :data:`_PLAUSIBLE_LOGLIK` of the best; of those, the one least at odds
    with independence): rates that differ by region are not mistaken for dependence. Using a config's own trials to set its ``p_c``
    would explain any clustering away; leaving them out keeps the test honest, and noise in ``p_c``
    only lowers the expected count (``q`` is concave), so it errs toward silence. The caveat fires
    when the observed count is below the mean by more than :data:`_CLUSTER_Z` standard deviations.
    """
    if "config_id" not in data or not len(data):
        return
    total, n_all = float(y.sum()), len(y)
    if total in (0.0, float(n_all)):
        return
    codes, _ = pd.factorize(data["config_id"].astype(str).to_numpy())
    m = np.bincount(codes).astype(float)
    f = np.bincount(codes, weights=y).astype(float)
    first = np.full(len(m), -1, dtype=np.int64)
    first[codes[::-1]] = np.arange(n_all)[::-1]
    multi = m >= 2
    if multi.sum() < 5 or (n_all - m).min() <= 0:
        return
    pooled = (total - f) / (n_all - m)
    observed = float(np.sum((f[multi] > 0) & (f[multi] < m[multi])))
    fits: list[tuple[float, float, float, float, str]] = []  # loglik, z, expected, sd, name
    for name, cell in [("pooled", np.zeros(n_all, dtype=np.int64)), *partitions]:
        cc = cell[first]  # a config's trials share its parameters, so its cell
        n_k = np.bincount(cell).astype(float)
        f_k = np.bincount(cell, weights=y).astype(float)
        p = (f_k[cc] - f + _PRIOR_TRIALS * pooled) / (n_k[cc] - m + _PRIOR_TRIALS)
        p = np.clip(p, 1e-9, 1 - 1e-9)
        loglik = float(np.sum(f * np.log(p) + (m - f) * np.log1p(-p)))
        mm, pp = m[multi], p[multi]
        q = 1.0 - pp ** mm - (1.0 - pp) ** mm
        expected, sd = float(q.sum()), float(np.sqrt(np.sum(q * (1.0 - q))))
        z = (observed + 0.5 - expected) / sd if sd > 0 else math.inf
        fits.append((loglik, z, expected, sd, name))
    top = max(fit[0] for fit in fits)
    # of the partitions that predict held-out configs about as well as the best, the one least at odds
    # with independence: the caveat fires only if every plausible reading of the regions contradicts it
    _, z, expected, sd, where = max((fit for fit in fits if fit[0] >= top - _PLAUSIBLE_LOGLIK), key=lambda t: t[1])
    if expected >= 2 and z < -_CLUSTER_Z:
        notes.warn("clustered", f"failures are nearly all-or-nothing per config ({observed:.0f} of {int(multi.sum())} "
                                f"configs with repeats have mixed outcomes where independent repeats would give "
                                f"{expected:.1f} ± {sd:.1f}, given the failure rates of {where}): repeats of a config "
                                "are not independent, so the intervals, which treat trials as such, are too narrow; "
                                "count configs, not trials, as the unit", subject)


# ---------------------------------------------------------------- model


def _terms(data: pd.DataFrame, plist: list[Parameter]) -> tuple[np.ndarray, list[str], list[str]]:
    """Model matrix (no constant), term names and what one unit of each term is."""
    cols: list[np.ndarray] = []
    names: list[str] = []
    per: list[str] = []
    for p in plist:
        raw = data[p.column].to_numpy()
        if p.kind == "categorical":
            vals = np.array([str(v) if not _is_missing(v) else "" for v in raw.tolist()], dtype=object)
            present = [lv for lv in p.levels if (vals == str(lv)).any()]
            for lv in present[1:]:
                cols.append((vals == str(lv)).astype(float))
                names.append(f"{p.name}={lv}")
                per.append(f"{p.name}={lv} vs {present[0]}")
            miss = vals == ""
        else:
            x = p.encode(raw)
            miss = ~np.isfinite(x)
            if (~miss).sum() and np.nanstd(x) > 0:
                mu, sd = float(np.nanmean(x)), float(np.nanstd(x))
                cols.append(np.where(miss, 0.0, (x - mu) / sd))
                names.append(p.name)
                if p.kind == "bool":
                    cols[-1] = np.where(miss, 0.0, x)
                    per.append(f"{p.name}=True vs False")
                elif p.log:
                    per.append(f"1 SD of log2({p.name}) ({sd:.3g} doublings)")
                else:
                    per.append(f"1 SD of {p.name} ({sd:.3g})")
        if miss.any() and (~miss).any():
            cols.append(miss.astype(float))
            names.append(f"{p.name}=default")
            per.append(f"{p.name} left at vLLM's default vs set")
    X = np.column_stack(cols) if cols else np.empty((len(data), 0))
    return X, names, per


_Key = tuple[tuple[str, ...], tuple[str, ...]]
_MAX_INTERACTIONS = 2  # terms the failure model may add to its main effects (forward selection by score test)
_SCREEN_LEVEL = 0.05  # family-wise level of the interaction screen and of the misfit check


def _fit(y: np.ndarray, Xc: np.ndarray, names: list[str],
         regions: list[tuple[tuple[str, ...], tuple[str, ...], np.ndarray]],
         start: np.ndarray | None = None) -> tuple[Any, list[str]]:
    """A logistic fit and the reasons it is meaningless (separation, no convergence, huge terms)."""
    import statsmodels.api as sm
    from statsmodels.tools.sm_exceptions import ConvergenceWarning, PerfectSeparationError, PerfectSeparationWarning

    reasons: list[str] = []
    result: Any = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result = sm.Logit(y, Xc).fit(method="newton", maxiter=100, disp=0, start_params=start)
        except PerfectSeparationError:
            reasons.append("statsmodels reports perfect prediction")
    for w in caught:
        if issubclass(w.category, PerfectSeparationWarning):
            reasons.append("statsmodels reports perfect or quasi-perfect prediction")
        elif issubclass(w.category, ConvergenceWarning):
            reasons.append("the fit did not converge")
    if result is not None:
        params = np.asarray(result.params, dtype=float)
        with np.errstate(all="ignore"):
            bse = np.asarray(result.bse, dtype=float)
        if not bool(result.mle_retvals.get("converged", True)):
            reasons.append("the fit did not converge")
        if not np.all(np.isfinite(params)) or not np.all(np.isfinite(bse)):
            reasons.append("non-finite coefficients or standard errors")
        else:
            big = [names[i - 1] if i else "intercept" for i in range(len(params))
                   if abs(params[i]) > _COEF_LIMIT or bse[i] > _SE_LIMIT]
            if big:
                reasons.append(f"huge coefficients or standard errors ({', '.join(big[:4])})")
        if not reasons:
            prob = 1.0 / (1.0 + np.exp(-(Xc @ params)))
            for names_r, key, idx in regions:
                rate = y[idx].mean()
                if rate in (0.0, 1.0) and (np.all(prob[idx] < _EXTREME) or np.all(prob[idx] > 1 - _EXTREME)):
                    label = ", ".join(_region_part(p, v) for p, v in zip(names_r, key))
                    reasons.append(f"the model drives region {label} (all {'failed' if rate else 'ok'}) to "
                                   f"{'1' if rate else '0'}")
                    break
    return result, reasons


_MAX_THRESHOLDS = 4  # split points per parameter among the candidate terms (quantiles of its levels)
_EVENTS_PER_TERM = 10  # fewer events (failures or successes, the rarer) per main-effect term: no model
_MAX_REJECTED = 5  # candidate terms that separate, tried and set aside, before the search stops
_BLOCK = 512  # candidate columns scored at a time (bounded memory on large tables)


@dataclass(frozen=True)
class _Candidate:
    """A term the failure model may add: ``kind`` ``split`` (an indicator: a parameter past a
    threshold, or two at once: a corner of the space, where OOM lives) or ``product``."""

    column: Callable[[], np.ndarray]
    term: str
    per: str


def _indicator(*masks: np.ndarray) -> Callable[[], np.ndarray]:
    """A candidate column built on demand: 1 where every mask holds."""
    def column() -> np.ndarray:
        return np.logical_and.reduce(masks).astype(float)
    return column


def _product(Xc: np.ndarray, a: int, b: int) -> Callable[[], np.ndarray]:
    def column() -> np.ndarray:
        return np.asarray(Xc[:, a] * Xc[:, b], dtype=float)
    return column


def _candidates(data: pd.DataFrame, plist: list[Parameter], Xc: np.ndarray, names: list[str]) -> list[_Candidate]:
    """Single-parameter splits, two-parameter corners (four orientations) and products of two main
    terms: the flexibility a tree would have, as a few logit columns."""
    splits: list[list[tuple[np.ndarray, str, str]]] = []  # per parameter: (>= t mask, ">= t" text, "< t" text)
    for p in plist:
        if p.kind == "categorical":
            continue
        raw = data[p.column].to_numpy()
        x = p.encode(raw) if p.kind == "bool" else pd.to_numeric(pd.Series(raw), errors="coerce").to_numpy(float)
        levels = np.unique(x[np.isfinite(x)])
        if len(levels) < 2:
            continue
        ts = levels[1:]
        if len(ts) > _MAX_THRESHOLDS:
            ts = np.unique(np.quantile(levels, np.linspace(0, 1, _MAX_THRESHOLDS + 2)[1:-1], method="higher"))
        out = []
        for t in ts:
            ge = np.isfinite(x) & (x >= t)
            if p.kind == "bool":
                out.append((ge, f"{p.name}=True", f"{p.name}=False"))
            else:
                out.append((ge, f"{p.name} >= {_fmt(t)}", f"{p.name} < {_fmt(t)}"))
        splits.append(out)
    cands: list[_Candidate] = []
    for per_param in splits:
        for ge, hi, _lo in per_param:
            cands.append(_Candidate(_indicator(ge), hi, f"trials with {hi} vs the rest"))
    for i in range(len(splits)):
        for j in range(i + 1, len(splits)):
            for ga, ha, la in splits[i]:
                for gb, hb, lb in splits[j]:
                    for ma, ta in ((ga, ha), (~ga, la)):
                        for mb, tb in ((gb, hb), (~gb, lb)):
                            term = f"{ta} and {tb}"
                            cands.append(_Candidate(_indicator(ma, mb), term, f"trials with {term} vs the rest"))
    mains = [i + 1 for i, nm in enumerate(names) if "=" not in nm and " " not in nm]
    for k, a in enumerate(mains):
        for b in mains[k + 1:]:
            cands.append(_Candidate(_product(Xc, a, b), f"{names[a - 1]} x {names[b - 1]}",
                                    f"product of the two terms' units ({names[a - 1]}, {names[b - 1]})"))
    return cands


def _best_candidate(y: np.ndarray, Xc: np.ndarray, result: Any, cands: list[_Candidate],
                    taken: set[str]) -> tuple[np.ndarray, _Candidate] | None:
    """The candidate term that most improves the fit, if its score test passes the Bonferroni
    screen over every candidate (family-wise :data:`_SCREEN_LEVEL`); else None.

    The score statistic for adding column ``z`` to a fitted logit is ``U^2 / I`` with ``U = z'(y - p)``
    and ``I = z'Wz - z'WX (X'WX)^-1 X'Wz`` (``W = p(1 - p)``): chi-squared with 1 degree of freedom when
    the term adds nothing. No refit per candidate."""
    live = [c for c in cands if c.term not in taken]
    if not live:
        return None
    prob = np.asarray(result.predict(Xc), dtype=float)
    w = prob * (1.0 - prob)
    try:
        xtwx_inv = np.linalg.pinv(Xc.T @ (Xc * w[:, None]))
    except np.linalg.LinAlgError:
        return None
    resid = y - prob
    best_stat, best_i = -1.0, -1
    for lo in range(0, len(live), _BLOCK):
        Z = np.column_stack([c.column() for c in live[lo:lo + _BLOCK]])
        wz = Z * w[:, None]
        xwz = Xc.T @ wz
        info = np.einsum("ij,ij->j", wz, Z) - np.einsum("ij,ij->j", xwz, xtwx_inv @ xwz)
        score = Z.T @ resid
        with np.errstate(divide="ignore", invalid="ignore"):
            stat = np.where(info > 1e-8 * np.maximum(1.0, np.einsum("ij,ij->j", wz, Z)), score ** 2 / info, 0.0)
        k = int(np.argmax(stat))
        if stat[k] > best_stat:
            best_stat, best_i = float(stat[k]), lo + k
    crit = NormalDist().inv_cdf(1 - _SCREEN_LEVEL / (2 * len(live))) ** 2
    if not best_stat > crit:
        return None
    return live[best_i].column(), live[best_i]


def _model(data: pd.DataFrame, y: np.ndarray, plist: list[Parameter],
           regions: list[tuple[tuple[str, ...], tuple[str, ...], np.ndarray]], level: float, seed: int,
           notes: Notes, subject: str
           ) -> tuple[str, list[Coefficient], dict[_Key, Interval], dict[_Key, tuple[float, float]]]:
    """The failure model: main effects, plus up to :data:`_MAX_INTERACTIONS` products of two terms
    chosen by a score test (Bonferroni over the pairs, family-wise :data:`_SCREEN_LEVEL`), so a
    failure corner (two settings together) is not averaged away. Returns the model's kind, its
    coefficients, per region its predicted rate with an interval, and per region the mean and
    variance of its failure count were the model true (for :func:`_misfit`)."""
    X, names, per = _terms(data, plist)
    fails, n = int(y.sum()), len(y)
    events = min(fails, n - fails)
    if X.shape[1] == 0:
        return "none", [], {}, {}
    if events < 5:
        notes.warn("few_events", f"{fails} failure(s) and {n - fails} success(es) among {n} trials: too few events "
                                 "for a logistic model; the regional Wilson intervals are the answer", subject)
        return "none", [], {}, {}
    if events < _EVENTS_PER_TERM * X.shape[1]:
        notes.warn("few_events", f"{events} events for {X.shape[1]} model terms (under {_EVENTS_PER_TERM} per term): "
                                 "too few for a logistic model whose regional intervals hold their stated coverage "
                                 "(in simulation they covered about 85% at 6 events per term); the regional Wilson "
                                 "intervals are the answer", subject)
        return "none", [], {}, {}
    Xc = np.column_stack([np.ones(n), X])
    try:
        result, reasons = _fit(y, Xc, names, regions)
    except (np.linalg.LinAlgError, ValueError) as exc:
        notes.warn("model_failed", f"the logistic model could not be fitted ({exc}); parameters may be aliased. "
                                   "The regional Wilson intervals are the answer", subject)
        return "fallback", [], {}, {}
    if reasons:
        uniq = list(dict.fromkeys(reasons))
        notes.warn("separation", f"separation or quasi-separation: {'; '.join(uniq)}. The logistic model's "
                                 "coefficients are meaningless here, so the regional Wilson intervals are the answer",
                   subject)
        log.info("failure model falls back to regional intervals: %s", "; ".join(uniq))
        return "fallback", [], {}, {}
    cands = _candidates(data, plist, Xc, names)
    added: list[str] = []
    rejected: set[str] = set()
    while len(added) < _MAX_INTERACTIONS and len(rejected) < _MAX_REJECTED:
        found = _best_candidate(y, Xc, result, cands, set(added) | rejected)
        if found is None:
            break
        col, cand = found
        trial_xc = np.column_stack([Xc, col])
        try:
            trial_result, trial_reasons = _fit(y, trial_xc, [*names, cand.term], regions,
                                               np.r_[np.asarray(result.params, dtype=float), 0.0])
        except (np.linalg.LinAlgError, ValueError):
            trial_reasons = ["singular"]
        if trial_reasons:
            rejected.add(cand.term)  # the term separates (a corner with no failures, say): try the next one
            continue
        Xc, result = trial_xc, trial_result
        names, per = [*names, cand.term], [*per, cand.per]
        added.append(cand.term)
    if added:
        notes.warn("failure_terms", f"the failure model adds {len(added)} term(s) the main effects miss "
                                    f"({'; '.join(added)}), chosen by a score test over {len(cands)} candidate splits, "
                                    "corners and products: failures concentrate there", subject)
    assert result is not None
    params = np.asarray(result.params, dtype=float)
    cov = np.asarray(result.cov_params(), dtype=float)
    bse = np.sqrt(np.diag(cov))
    pvals = np.asarray(result.pvalues, dtype=float)
    z = NormalDist().inv_cdf(1 - (1 - level) / 2)
    coefs = []
    for i, (term, unit) in enumerate(zip(["intercept", *names], ["log-odds at the mean", *per])):
        lo, hi = params[i] - z * bse[i], params[i] + z * bse[i]
        coefs.append(Coefficient(term, unit, Interval(float(params[i]), float(lo), float(hi), level),
                                 Interval(math.exp(params[i]), math.exp(lo), math.exp(hi), level), float(pvals[i])))
    rng = np.random.default_rng(seed)
    draws = rng.multivariate_normal(params, cov, size=_N_DRAWS, method="svd")
    # trials of one config share a model row: evaluate the draws once per distinct row
    rows, inverse = np.unique(Xc, axis=0, return_inverse=True)
    inverse = np.asarray(inverse).reshape(-1)
    prob_draws = 1.0 / (1.0 + np.exp(-np.clip(rows @ draws.T, -50, 50)))
    prob_hat = 1.0 / (1.0 + np.exp(-(rows @ params)))
    lo_q, hi_q = (1 - level) / 2, 1 - (1 - level) / 2
    predicted: dict[_Key, Interval] = {}
    checks: dict[_Key, tuple[float, float]] = {}
    for names_r, key, idx in regions:
        counts = np.bincount(inverse[idx], minlength=len(rows)).astype(float)
        weights = counts / counts.sum()
        means = weights @ prob_draws
        a, b = np.quantile(means, [lo_q, hi_q])
        predicted[(names_r, key)] = Interval(float(weights @ prob_hat), float(a), float(b), level)
        # the region's failure count if the model were true: binomial spread of its trials plus the
        # spread of the model's own estimate
        m = float(len(idx))
        checks[(names_r, key)] = (float(counts @ prob_hat),
                                  float(counts @ (prob_hat * (1.0 - prob_hat)) + m * m * float(np.var(means))))
    return "logit", coefs, predicted, checks


def _misfit(regions: list[RegionRate], checks: dict[_Key, tuple[float, float]], notes: Notes, subject: str) -> None:
    """``model_misfit`` where a region's failure count departs from the model's prediction beyond
    their joint uncertainty: ``(|F - E| - 1/2) / sqrt(V)`` over the Bonferroni-corrected normal quantile
    (family-wise :data:`_SCREEN_LEVEL` over the regions tested), ``E`` and ``V`` the count's mean and
    variance were the model true (binomial spread plus the model's own uncertainty). Regions of at
    least ``_MIN_CELL`` trials are tested. (Non-overlap of the two 95% intervals, the former rule,
    is a per-region test at about 5% when the model's interval is narrow: over dozens of regions it
    fired in 6 of 20 seeds where the model was right.)"""
    tested = [(r, checks[(r.params, r.levels)]) for r in regions
              if r.predicted is not None and r.n >= _MIN_CELL and (r.params, r.levels) in checks]
    if not tested:
        return
    crit = NormalDist().inv_cdf(1 - _SCREEN_LEVEL / (2 * len(tested)))
    missed = [r for r, (e, v) in tested if v > 0 and (abs(r.failures - e) - 0.5) / math.sqrt(v) > crit]
    if missed:
        shown = "; ".join(f"{r.label}: observed {r.rate}, model {r.predicted}" for r in missed[:3])
        notes.warn("model_misfit", f"the logistic failure model misses {len(missed)} region(s) ({shown}"
                                   f"{'; ...' if len(missed) > 3 else ''}) beyond the uncertainty of both: an "
                                   "interaction it lacks is likely; trust the regional intervals there", subject)
