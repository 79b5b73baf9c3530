"""What each caveat code of :mod:`analysis` means, in one sentence a reader can act on.

The dashboard shows every caveat as ``code: message``; the message says what happened in this
result, :data:`MEANING` says what the code means in general, so a reader never has to look a code
up. A code not listed here is shown with its message alone.
"""

from __future__ import annotations

MEANING: dict[str, str] = {
    "single_repeat": "a config ran once: its spread is unknown, so intervals and comparisons involving it cannot be trusted",
    "few_repeats": "too few repeats for a narrow interval: differences smaller than the noise cannot be told apart",
    "too_few_repeats": "not enough repeats to estimate the spread this needs",
    "repeats_share_server": "a config's repeats ran in one server start: intervals leave out start-to-start variation",
    "pruned": "planning left this engine config out before any trial (it cannot fit in device memory): it has no results",
    "no_slos": "the spec states no SLO, so nothing is gated on latency",
    "forest_bands": "the bands come from refitting a random forest on resamples, not from a calibrated model",
    "no_interval": "too few configs for a calibrated interval here: the estimate is stated alone",
    "few_events": "few failures were seen: the failure model is rough and its intervals wide",
    "failover_trials": "some trials ran on other hardware after their own class failed over",
    "failover_excluded": "trials that failed over to other hardware are left out",
    "drift_unchecked": "drift could not be checked (no or too few baseline re-runs); no trial was left out for drift",
    "drift_included": "drift-suspect trials are included in these numbers",
    "drift_excluded": "drift-suspect trials are left out of these numbers",
    "drift": "the baseline moved during the sweep: trials measured after it may be biased",
    "no_baseline": "no usable baseline re-runs: drift cannot be checked",
    "few_baseline_runs": "too few baseline re-runs to chart drift reliably",
    "baseline_unusable": "some baseline re-runs failed or lack the metric and are left out of the drift charts",
    "short_reference": "the drift chart's reference period is short, so its limits are rough",
    "aliased": "two parameters always moved together in this design: their effects cannot be separated",
    "correlated": "parameters are correlated in the sampled configs: their effects are partly confounded",
    "zero_variation": "a parameter took one value only: nothing can be said about its effect",
    "weak_joint_effect": "the pair moves the metric little in total: its interaction share is unstable",
    "unobserved_cells": "some level combinations were never measured: that part of the surface is extrapolated",
    "thin_cells": "some level combinations have very few trials",
    "selected_pairs": "only some parameter pairs were computed (the strongest candidates)",
    "too_few_configs": "too few distinct configs to fit this reliably",
    "too_few_trials": "too few trials to fit this reliably",
    "same_config": "the two sides are the same config",
    "regions_capped": "only the most failure-prone regions are listed",
    "pooled_scenarios": "several load points are pooled in one fit",
    "no_trials": "no trial matches this selection",
    "no_regions": "no region with enough trials to estimate a failure rate",
    "no_prices": "no GPU-hour price for this hardware class: cost cannot be computed (prices are never invented)",
    "unused_prices": "prices were given for hardware classes this experiment did not use",
    "no_data": "some configs have no ok trial with these metrics and are not shown",
    "no_bootstrap": "no bootstrap was run (large experiment): scores have no intervals",
    "model_misfit": "the model fits the data poorly: read its numbers as rough",
    "poor_fit": "the surrogate model predicts held-out trials poorly: importance and effects are rough",
    "model_failed": "the model could not be fitted; a simpler estimate is shown",
    "missing_values": "some trials lack a value and are left out",
    "linear_main_effects": "main effects come from a linear model: curvature is not captured",
    "holes": "some planned trials were never measured (holes): the result stands on fewer trials",
    "few_heldout": "few held-out trials to score the model on: its fit is itself uncertain",
    "failure_terms": "the failure model uses only the terms the data can support",
    "separation": "failures fall entirely on one side of a parameter value: the logistic model breaks down, so "
                  "Wilson intervals are shown instead",
    "clustered": "trials of one config are not independent: intervals are clustered by config",
    "one_class": "one hardware class only: nothing is compared across hardware",
}

#: what "hole" means, shown where holes are counted
HOLES = ("holes: trials planned but never measured (not yet run, lost with their daemon, or drained "
         "off failed hardware); each is recorded with why, and a resumed sweep runs them")
