"""Benchmarks of the analysis package (issue 4): ``python -m benchmarks.analysis``.

- ``importance``: our parameter importance side by side with Optuna's fANOVA and PED-ANOVA
  evaluators on planted datasets (:mod:`.side_by_side`);
- ``scale``: the full analysis on 10,000 trials x 12 parameters, and a Pareto front plus an
  SLO-constrained ranking on 1,000,000 trials (:mod:`.scale`);
- ``all`` (the default): both, then the "Analysis" section of ``benchmarks/RESULTS.md``.
"""
