"""Compare two engine configs on one metric: ratio of medians with a bootstrap interval, a rank test
where the repeats allow one, and a verdict that respects a minimum practical effect.

The unit of replication is the repeat (one trial of a config at a load point); requests inside a
trial are never treated as independent. Baseline re-runs are left out.

Verdict (``r`` = median of b / median of a, CI its bootstrap percentile interval, ``e`` the minimum
practical effect; for metrics where less is better, "better" means a lower ratio):

- ``"b better"``: the CI lies entirely beyond ``1 + e`` in b's favour (below ``1 - e`` when less is
  better); ``"a better"`` mirrors it;
- ``"equivalent"``: the CI lies inside ``[1 - e, 1 + e]``: any difference is smaller than matters;
- ``"inconclusive"``: anything else, including fewer than 2 repeats on either side (a bootstrap of one
  trial has no spread, so its interval would be falsely narrow).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import xarray as xr

from analysis.common import (
    Caveat,
    Claim,
    Interval,
    Notes,
    Subsample,
    claim_for,
    context_of,
    percentile_interval,
    warn_if_repeats_share_a_server,
)
from analysis.frame import AnalysisInputError, metric_sense, trial_table

log = logging.getLogger(__name__)

LEVEL = 0.95
MIN_REPEATS_RANK_TEST = 3
VERDICTS = ("b better", "a better", "equivalent", "inconclusive")


@dataclass(frozen=True)
class Comparison:
    """Config ``b`` against config ``a`` on ``metric`` at one load point and hardware class.

    ``ratio`` is median(b) / median(a) over their repeats with a bootstrap interval (NaN bounds when
    either side has fewer than 2 repeats); ``p_value`` the two-sided Mann-Whitney U test of the
    repeats (None when either side has fewer than 3); ``rank_test`` says which in words.
    """

    config_a: str
    config_b: str
    label_a: str
    label_b: str
    metric: str
    higher_is_better: bool
    load_point: str
    hardware_class: str
    n_a: int
    n_b: int
    median_a: float
    median_b: float
    ratio: Interval
    min_effect: float
    p_value: float | None
    rank_test: str
    verdict: str
    sentence: str
    claim: Claim
    warnings: list[Caveat] = field(default_factory=list)
    subsampled: list[Subsample] = field(default_factory=list)


def resolve_config(df: pd.DataFrame, ref: str) -> str:
    """The config id ``ref`` names: an exact config id, else a unique prefix of one, else an exact
    config label. Raises :class:`AnalysisInputError` naming ``ref`` when none or several match."""
    ids = sorted({str(v) for v in df["config_id"].to_numpy(dtype=object)})
    if ref in ids:
        return ref
    pref = [i for i in ids if i.startswith(ref)] if ref else []
    if len(pref) == 1:
        return pref[0]
    if "config_label" in df:
        labels = df[["config_id", "config_label"]].drop_duplicates()
        hit = sorted({str(c) for c, lab in zip(labels["config_id"], labels["config_label"]) if str(lab) == ref})
        if len(hit) == 1:
            return hit[0]
        if len(hit) > 1:
            raise AnalysisInputError(f"config label {ref!r} names {len(hit)} configs: {', '.join(hit[:5])}")
    if len(pref) > 1:
        raise AnalysisInputError(f"config prefix {ref!r} is ambiguous: {len(pref)} configs start with it "
                                 f"({', '.join(pref[:5])}{', ...' if len(pref) > 5 else ''})")
    raise AnalysisInputError(f"unknown config {ref!r}: no config id, id prefix or label matches it")


def _ratio_samples(a: np.ndarray, b: np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    ia = rng.integers(0, len(a), size=(n_boot, len(a)))
    ib = rng.integers(0, len(b), size=(n_boot, len(b)))
    ma = np.median(a[ia], axis=1)
    mb = np.median(b[ib], axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.asarray(mb / ma, dtype=float)


def verdict_of(ratio: Interval, sense: int, min_effect: float) -> str:
    """The verdict for a ratio interval (see the module docstring)."""
    lo, hi = ratio.low, ratio.high
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return "inconclusive"
    up, down = 1.0 + min_effect, 1.0 - min_effect
    if lo > up:
        return "b better" if sense > 0 else "a better"
    if hi < down:
        return "a better" if sense > 0 else "b better"
    if lo >= down and hi <= up:
        return "equivalent"
    return "inconclusive"


def _pick(df: pd.DataFrame, column: str, wanted: str | None, cfgs: tuple[str, str], what: str) -> str:
    both = [set(df.loc[df["config_id"] == c, column].astype(str)) for c in cfgs]
    shared = sorted(both[0] & both[1])
    if wanted is not None:
        if wanted not in shared:
            raise AnalysisInputError(f"{what} {wanted!r} does not hold trials of both configs; shared: "
                                     f"{', '.join(shared) or 'none'}")
        return wanted
    if len(shared) == 1:
        return shared[0]
    if not shared:
        raise AnalysisInputError(f"the two configs share no {what}")
    raise AnalysisInputError(f"the configs share several {what}s ({', '.join(shared)}); choose one")


def compare(ds: xr.Dataset, config_a: str, config_b: str, metric: str = "output_throughput",
            load_point: str | None = None, min_effect: float = 0.05, n_boot: int = 2000, seed: int = 0,
            hardware_class: str | None = None, table: pd.DataFrame | None = None) -> Comparison:
    """Compare config ``b`` with config ``a`` on ``metric``.

    Args:
        ds: an experiment's dataset.
        config_a, config_b: config ids, unique id prefixes or labels.
        metric: a column of :func:`analysis.frame.trial_table` with a known sense.
        load_point: the scenario (required when the configs share several).
        min_effect: the smallest relative difference that matters (0.05 = 5%).
        n_boot: bootstrap resamples of each side's repeats.
        seed: seed of the resampling.
        hardware_class: the hardware class (required when the configs ran on several; incomparable
            hardware is never mixed).
        table: the trial table of ``ds`` if already built.

    Returns:
        A :class:`Comparison` with the ratio's interval, the rank test, the verdict and a sentence in
        the wording the design allows (effect or association, :func:`analysis.common.claim_for`).

    Raises:
        AnalysisInputError: an unknown config, metric, load point or hardware class.
    """
    if not (isinstance(min_effect, (int, float)) and 0 <= min_effect < 1):
        raise AnalysisInputError(f"min_effect must be in [0, 1), got {min_effect!r}")
    df = trial_table(ds) if table is None else table
    sense = metric_sense(metric)
    if metric not in df:
        raise AnalysisInputError(f"unknown metric {metric!r}: no such column in the trial table")
    if "is_baseline" in df:
        df = df[~df["is_baseline"].to_numpy(dtype=bool)]
    a_id, b_id = resolve_config(df, config_a), resolve_config(df, config_b)
    notes = Notes()
    warn_if_repeats_share_a_server(ds, notes)
    if a_id == b_id:
        notes.warn("same_config", f"config a and config b are the same config ({a_id})")
    lp = _pick(df, "load_point", load_point, (a_id, b_id), "load point") if "load_point" in df else ""
    sub = df[df["load_point"].astype(str) == lp] if "load_point" in df else df
    hw = _pick(sub, "hardware_class", hardware_class, (a_id, b_id), "hardware class") if "hardware_class" in sub else ""
    if "hardware_class" in sub:
        sub = sub[sub["hardware_class"].astype(str) == hw]
    ok = sub[sub["status"].astype(str) == "ok"]
    a = ok.loc[ok["config_id"] == a_id, metric].to_numpy(dtype=float)
    b = ok.loc[ok["config_id"] == b_id, metric].to_numpy(dtype=float)
    a, b = np.sort(a[np.isfinite(a)]), np.sort(b[np.isfinite(b)])  # sorted: row order never matters
    labels = _labels(sub, (a_id, b_id))
    med_a = float(np.median(a)) if len(a) else math.nan
    med_b = float(np.median(b)) if len(b) else math.nan
    est = med_b / med_a if len(a) and len(b) and med_a != 0 else math.nan
    if len(a) >= 2 and len(b) >= 2 and n_boot > 0:
        samples = _ratio_samples(a, b, n_boot, np.random.default_rng(seed))
        ratio = percentile_interval(samples, estimate=est, level=LEVEL)
    else:
        ratio = Interval(est, math.nan, math.nan, LEVEL)
        notes.warn("too_few_repeats", f"a has {len(a)} and b has {len(b)} usable repeat(s) of {metric}; an interval "
                                      "needs at least 2 on each side (one trial has no spread to resample), so the "
                                      "verdict is inconclusive")
    if 2 <= min(len(a), len(b)) < 5:
        notes.warn("few_repeats", f"with {min(len(a), len(b))} repeats on a side the bootstrap interval is rough "
                                  "(it tends to be too narrow); more repeats make the verdict firmer")
    p_value: float | None = None
    if len(a) >= MIN_REPEATS_RANK_TEST and len(b) >= MIN_REPEATS_RANK_TEST:
        from scipy.stats import mannwhitneyu

        p_value = float(mannwhitneyu(b, a, alternative="two-sided").pvalue)
        rank_test = f"Mann-Whitney U over repeats ({len(a)} vs {len(b)}): two-sided p = {p_value:.3g}"
    else:
        rank_test = (f"a rank test is not possible: it needs at least {MIN_REPEATS_RANK_TEST} repeats on each side "
                     f"(a has {len(a)}, b has {len(b)})")
    verdict = verdict_of(ratio, sense, float(min_effect))
    claim = claim_for(ds)
    sentence = _sentence(claim, ds, lp, labels, metric, ratio, verdict, float(min_effect))
    return Comparison(
        config_a=a_id, config_b=b_id, label_a=labels[0], label_b=labels[1], metric=metric,
        higher_is_better=sense > 0, load_point=lp, hardware_class=hw, n_a=len(a), n_b=len(b), median_a=med_a,
        median_b=med_b, ratio=ratio, min_effect=float(min_effect), p_value=p_value, rank_test=rank_test,
        verdict=verdict, sentence=sentence, claim=claim, warnings=notes.warnings, subsampled=notes.subsampled)


def _labels(df: pd.DataFrame, ids: tuple[str, str]) -> tuple[str, str]:
    out = []
    for c in ids:
        rows = df.loc[df["config_id"] == c]
        out.append(str(rows["config_label"].iloc[0]) if "config_label" in df and len(rows) else c)
    return out[0], out[1]


def _sentence(claim: Claim, ds: xr.Dataset, lp: str, labels: tuple[str, str], metric: str, ratio: Interval,
              verdict: str, min_effect: float) -> str:
    ctx = context_of(ds, lp or None)
    if not math.isfinite(ratio.estimate):
        return f"{metric} cannot be compared: one of the configs has no usable trial"
    change = f"{(ratio.estimate - 1) * 100:+.3g}%"
    if math.isfinite(ratio.low):
        change += f" [{(ratio.low - 1) * 100:+.3g}%, {(ratio.high - 1) * 100:+.3g}%]"
    a, b = labels
    if claim.kind == "effect":
        head = f"switching the engine config from {a} to {b} changed median {metric} by {change} {ctx.words()}"
    else:
        head = (f"trials of {b} had median {metric} {change} relative to {a} {ctx.words()} (an association, not "
                f"an effect: {claim.why})")
    tail = {
        "b better": f"b is better by more than the {min_effect:.0%} that matters",
        "a better": f"a is better by more than the {min_effect:.0%} that matters",
        "equivalent": f"the two are equivalent: any difference is within {min_effect:.0%}",
        "inconclusive": f"inconclusive: the interval does not settle whether the difference exceeds {min_effect:.0%}",
    }[verdict]
    return f"{head}; {tail}"
