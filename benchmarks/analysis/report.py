"""The analysis section of ``benchmarks/RESULTS.md``, from one run's figures.

The section sits between :data:`BEGIN` and :data:`END`; a new run replaces it and leaves the rest
of RESULTS.md (the load-generator section) alone. Times are medians over the runs stated.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from benchmarks.analysis.scale import fmt_s
from benchmarks.common import machine_table, replace_section

BEGIN = "<!-- analysis:begin (written by `python -m benchmarks.analysis`; edits inside are overwritten) -->"
END = "<!-- analysis:end -->"

FULL_TARGET_S = 60.0
MILLION_TARGET_S = 2.0


def _frac(x: float) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.0%}"


def _count(pair: Any) -> str:
    if pair is None:
        return "no flag available"
    k, n = pair
    return f"{k}/{n} ({k / n:.0%})" if n else "n/a"


def importance_lines(imp: dict[str, Any]) -> list[str]:
    out = [
        "### Parameter importance: ours vs Optuna's fANOVA and PED-ANOVA",
        "",
        f"Data: `analysis.synthetic.planted(n_configs=n, n_params={imp['n_params']}, noise={imp['noise']:g}, seed=s)` "
        f"for n in {', '.join(str(n) for n in imp['sizes'])} and {imp['seeds']} seeds s = 0..{imp['seeds'] - 1} "
        "(random design, one trial per config, about 5% of trials failed). Target, the same for every tool: "
        "log output throughput of the ok, non-baseline trials. Parameters: "
        + ", ".join(f"`{p}`" for p in imp["params"]) + ".",
        "",
        "- Planted important (effect on log throughput over the range): "
        + ", ".join(f"`{p}` ({imp['effects'].get(p, 0):g})" for p in imp["important"])
        + (f"; interaction `{imp['interaction'][0]}` x `{imp['interaction'][1]}` (-0.45)" if imp["interaction"] else "")
        + "; noise sd 0.05 on the log scale.",
        "- Planted no effect: " + ", ".join(f"`{p}`" for p in imp["null"]) + ". `gpu_memory_utilization` is "
        "neither: no effect on throughput, but it drives the planted failure region, so among ok trials it "
        "is weakly associated with throughput; it is left out of the scores.",
        f"- Ours: `analysis.importance.importance(ds, n_boot={imp['n_boot']}, seed=s)`; ranking by the median "
        "permutation importance; a parameter is flagged when its verdict is \"indistinguishable from noise\". "
        "Optuna: `optuna.importance.get_param_importances` on an in-memory study (one `create_trial` per ok "
        "trial, `direction=\"maximize\"`; bool/string parameters as `CategoricalDistribution`, integers as "
        "`IntDistribution`, log scale when the levels span a ratio >= 4) with "
        "`FanovaImportanceEvaluator(seed=s)` and `PedAnovaImportanceEvaluator()` (defaults: 64 trees; "
        "top 10% quantile). Time: the call alone (Optuna: the evaluator, not building the study), median "
        "over seeds.",
        "",
        "| n | tool | ok trials | time (s), median [min, max] | time / fANOVA's | top-k = planted k | a no-effect param outranks a "
        "planted one (seeds) | misordered (planted, no-effect) pairs | no-effect params flagged as noise | "
        "planted params flagged as noise |",
        "| ---: | --- | ---: | --- | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    k = len(imp["important"])
    fanova = {s["n_configs"]: s["seconds_median"] for s in imp["summaries"] if s["tool"] == "Optuna fANOVA"}
    for s in imp["summaries"]:
        ref = fanova.get(s["n_configs"])
        ratio = f"{s['seconds_median'] / ref:.2f}x" if ref else "n/a"
        out.append(
            f"| {s['n_configs']} | {s['tool']} | {s['n_trials_median']:.0f} | {s['seconds_median']:.3f} "
            f"[{s['seconds_min']:.3f}, {s['seconds_max']:.3f}] | {ratio} | {_frac(s['topk_equal'])} | "
            f"{_frac(s['null_outranks_planted'])} | {_frac(s['misordered_pairs'])} | {_count(s['null_flagged'])} | "
            f"{_count(s['planted_flagged'])} |")
    ped = [s for s in imp["summaries"] if s["tool"] == "Optuna PED-ANOVA"]
    out += ["", f"(k = {k}; fractions are over the {imp['seeds']} seeds, or over parameter x seed pairs.) Ours fits "
            f"{imp['n_boot']} bootstrap forests of {imp.get('n_trees', '?')} trees plus SHAP per call; fANOVA fits one forest of 64 trees "
            "and PED-ANOVA fits Parzen estimators, without intervals."
            + "".join(f" At n = {s['n_configs']} PED-ANOVA's default top 10% is about "
                      f"{max(1, round(0.1 * s['n_trials_median']))} trials" for s in ped[:1])
            + (" (Optuna's documentation advises at least 5)." if ped and 0.1 * ped[0]["n_trials_median"] < 5 else ""),
            "",
            "Median rank (1 = most important) of each planted parameter:", "",
            "| n | tool | " + " | ".join(f"`{p}`" for p in imp["important"]) + " |",
            "| ---: | --- | " + " | ".join("---:" for _ in imp["important"]) + " |"]
    for s in imp["summaries"]:
        out.append(f"| {s['n_configs']} | {s['tool']} | "
                   + " | ".join(f"{s['planted_median_rank'][p]:g}" for p in imp["important"]) + " |")
    notes = [(s["n_configs"], n) for s in imp["summaries"] for n in s["notes"]]
    if notes:
        out += ["", "What our importance said about these data (its warnings and subsampling notes):", ""]
        out += [f"- n = {size}: {n}" for size, n in notes[:16]]
    if imp.get("commentary"):
        out += ["", *imp["commentary"]]
    return out


def _hotspot_lines(prof: dict[str, Any], what: str, top: int = 10) -> list[str]:
    """Where the time goes: the functions with the most own time in a cProfile run."""
    out = [f"Where the time goes (cProfile of {what}: {prof['total_s']:.1f} s under the profiler; functions by "
           "own time):", "", "| function | where | calls | own (s) | cumulative (s) |", "| --- | --- | ---: | ---: | ---: |"]
    waiting = False
    for h in prof["hotspots"][:top]:
        func = str(h["function"]).replace("|", "\\|")
        where = h["where"]
        if "time.sleep" in func or "_thread.lock" in func:
            where = "joblib, waiting (*)"
            waiting = True
        out.append(f"| `{func}` | {where} | {h['calls']:,} | {h['own_s']:.2f} | {h['cum_s']:.2f} |")
    if waiting:
        out += ["", "(*) the main thread waiting while joblib's worker threads fit the forests' trees "
                "(scikit-learn fits with `n_jobs`; cProfile sees only the main thread, so tree building itself "
                "does not appear)."]
    return out


def scale_lines(sc: dict[str, Any]) -> list[str]:
    out: list[str] = []
    a = sc.get("full")
    if a:
        met = a["total_s_median"] < FULL_TARGET_S
        out += [
            f"### Full analysis on {a['trials']:,} trials x {a['n_params']} parameters",
            "",
            f"`analysis.report.analyze(ds, n_boot={a['n_boot']})` on `planted(n_configs={a['n_configs']}, "
            f"n_params={a['n_params']})` ({a['trials']:,} trials, {a['counts'].get('ok', 0):,} ok; generation "
            f"{a['generate_s']:.1f} s, not counted): every section it runs, timed by `analyze` itself "
            f"(`timings_s`), median of {a['repeats']} runs.",
            "",
            "| part | wall time (s) |",
            "| --- | ---: |",
        ]
        for k, v in a["sections_s_median"].items():
            out.append(f"| {k} | {fmt_s(v)} |")
        out.append(f"| **total** | **{fmt_s(a['total_s_median'])}** |")
        out += ["", f"Runs: {', '.join(fmt_s(x) for x in a['total_s_runs'])} s. Target < {FULL_TARGET_S:g} s: "
                + ("**met**." if met else f"**missed** by {a['total_s_median'] - FULL_TARGET_S:.1f} s "
                   f"({a['total_s_median'] / FULL_TARGET_S:.2f}x).")]
        if a.get("skipped"):
            out += ["", "Sections the output marks skipped: "
                    + "; ".join(f"{k}: {v}" for k, v in a["skipped"].items())]
        subs = a.get("subsampled") or []
        if subs:
            out += ["", "What the output says it subsampled (as `analyze` reports it; a note repeated by several "
                    "results of one section is listed once, with how many):", ""]
            counted: dict[tuple[str, str, Any, Any], int] = {}
            for item in subs:
                key = (str(item.get("section", "")), str(item.get("what", "")), item.get("used"), item.get("of"))
                counted[key] = counted.get(key, 0) + 1
            for (sec, what, used, of), count in counted.items():
                size = f"{used:,} of {of:,}" if isinstance(used, int) and isinstance(of, int) else f"{used} of {of}"
                out.append(f"- {sec}: {what}: {size}" + (f" (x{count})" if count > 1 else ""))
        else:
            out += ["", "The output reports no subsampling."]
        if a.get("profile"):
            out += ["", *_hotspot_lines(a["profile"], "one more full analysis")]
        if a.get("commentary"):
            out += ["", *a["commentary"]]
    b = sc.get("million")
    if b:
        med = b["steps_s_median"]
        total = b["pipeline_s_median"]
        met = total < MILLION_TARGET_S
        fs, rs = b["front_summary"], b["rank_summary"]
        out += [
            "",
            f"### Pareto front + SLO-constrained ranking on {b['trials']:,} trials",
            "",
            f"`benchmarks.analysis.bigdata.vectorised(n_configs={b['n_configs']:,}, repeats={b['repeats_per_config']})`: "
            f"{b['trials']:,} trials ({b['ok']:,} ok) of {b['n_configs']:,} configs in the dataset's shape, built "
            f"with numpy in {b['generate_s']:.1f} s (not counted)"
            + (f"; `planted()` took {b['planted_check']['seconds']:.1f} s for "
               f"{b['planted_check']['n_configs']:,} configs, so about {b['planted_check']['extrapolated_1m_s']:.0f} s "
               "for a million" if b.get("planted_check") else "")
            + f". Medians of {b['runs']} runs. The front has {fs['on_front']} of {fs['configs']:,} configs; the "
            f"ranking orders {rs['configs']:,} configs.",
            "",
            "| step | wall time (s) |",
            "| --- | ---: |",
        ]
        if "front_ds" in med and "shared_s_median" in b:
            top = b.get("top", 10)
            out += [
                f"| `front(ds, metrics=(\"output_throughput\", \"ttft_ms_p99\"), n_boot=0, points=\"front\")` "
                f"(lean table built inside; no cached grouping) | {fmt_s(med['front_ds'])} |",
                f"| `rank(ds, policy=\"slo_throughput\", n_boot=0, top={top})` (lean table; reuses front's grouping "
                f"of the same dataset) | {fmt_s(med['rank_ds'])} |",
                f"| **front + rank from the dataset (held to the target)** | **{fmt_s(total)}** |",
                f"| `df = trial_table(ds)` (the full table, ~90 columns) | {fmt_s(med['trial_table'])} |",
                f"| `front(..., points=\"front\", table=df)` | {fmt_s(med['front_table'])} |",
                f"| `rank(..., top={top}, table=df)` | {fmt_s(med['rank_table'])} |",
                f"| full table + front + rank (sharing the table) | {fmt_s(b['shared_s_median'])} |",
            ]
            if "all_ds_s_median" in b:
                out += [f"| `front(ds, ..., n_boot=0)` + `rank(ds, ..., n_boot=0)` with their defaults (every "
                        f"config's point and row materialised) | {fmt_s(b['all_ds_s_median'])} |"]
        else:  # figures of a run before the lean paths existed
            out += [
                f"| `df = trial_table(ds)` | {fmt_s(med['trial_table'])} |",
                f"| `front(ds, metrics=(\"output_throughput\", \"ttft_ms_p99\"), n_boot=0, table=df)` | "
                f"{fmt_s(med['front_table'])} |",
                f"| `rank(ds, policy=\"slo_throughput\", n_boot=0, table=df)` | {fmt_s(med['rank_table'])} |",
                f"| **table + front + rank** | **{fmt_s(total)}** |",
            ]
            if "front_ds" in med:
                out += [f"| front + rank, each from the dataset alone (two tables built) | "
                        f"{fmt_s(b['from_ds_s_median'])} |"]
        out += [
            f"| `pareto_mask` on the two raw columns ({b['ok']:,} points; the floor) | {fmt_s(med['pareto_mask'])} |",
            "",
            f"Runs (front + rank from the dataset): {', '.join(fmt_s(x) for x in b['pipeline_s'])} s. "
            f"Target < {MILLION_TARGET_S:g} s: "
            + ("**met**." if met else f"**missed** by {total - MILLION_TARGET_S:.2f} s ({total / MILLION_TARGET_S:.2f}x)."),
        ]
        if b.get("profile"):
            out += ["", *_hotspot_lines(b["profile"], "one more front + rank from the dataset" if "shared_s_median" in b
                                        else "one more table + front + rank")]
        if b.get("commentary"):
            out += ["", *b["commentary"]]
    return out


def _load_of(text: str | None) -> float | None:
    try:
        return float(str(text).split()[0])
    except (ValueError, IndexError):
        return None


def _load_note(machine: dict[str, str]) -> list[str]:
    """A warning when the machine was not quiet: wall times then include waiting for the CPU."""
    start = _load_of(machine.get("1-min load average at start"))
    end = _load_of(machine.get("1-min load average at end"))
    cores = _load_of(machine.get("cores (nproc)")) or 1.0
    worst = max(x for x in (start, end, 0.0) if x is not None)
    if worst < 1.0:
        return []
    return [f"**The machine was shared during this run** (1-min load average {start} at start, {end} at end, on "
            f"{cores:g} cores: other processes were running): every wall time below includes waiting for a CPU "
            "and is an upper bound; rankings and flags do not depend on it. Re-run on a quiet machine for "
            "the speed figures.", ""]


def section(machine: dict[str, str], commands: list[str], started: str, wall_s: float,
            imp: dict[str, Any] | None, sc: dict[str, Any] | None) -> str:
    lines = [
        BEGIN,
        "## Analysis: importance vs Optuna, and analysis at scale",
        "",
        "Commands (from the repository root): " + "; ".join(f"`{c}`" for c in commands),
        "",
        f"Run on {started} (UTC), wall time {wall_s:.0f} s. Data are SYNTHETIC (`analysis.synthetic`: "
        "planted effects, known truth), never measurements.",
        "",
        *machine_table(machine),
        "",
        *_load_note(machine),
    ]
    if imp:
        lines += importance_lines(imp) + [""]
    if sc:
        lines += scale_lines(sc) + [""]
    lines.append(END)
    return "\n".join(lines) + "\n"


def write_section(path: Path, text: str) -> None:
    """Replace the section between the markers in ``path``, or append it."""
    replace_section(path, text, BEGIN, END)
