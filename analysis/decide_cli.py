"""``python -m analysis.decide_cli recommend EXPERIMENT ...``: what to deploy, and a decision record.

``python -m coordinator recommend`` runs exactly this (the coordinator never imports ``analysis``).
Options: ``--weights lp=w,...`` (traffic mix; default equal), ``--slo metric<=value`` (repeatable;
``ttft_ms_p99<=200``, or ``ttft_ms<=200`` for the 99th percentile; replaces the spec's SLOs),
``--rule weighted|regret``, ``--include-drift``, ``--json``, ``--cross-hardware per_gpu|per_gpu_hour``
with ``--gpu-hour-price CLASS=USD``. Exit codes: 0 decided (record written), 2 bad input (named;
nothing written). The record (:data:`RECORD_FILE` in the experiment folder) is written atomically
(a temporary file renamed over it) and holds the inputs, rule, winner, runner-up, margin,
thresholds, evidence and the dataset's fingerprint (with the SHA-256 of ``results.nc``), so every
later reader names the same config.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from analysis.common import jsonable
from analysis.crosshw import parse_prices
from analysis.decision import CROSS_MODES, RULES, Decision, recommend, serve_params
from analysis.frame import AnalysisInputError, trial_table
from analysis.load import load
from analysis.sla_decision import read_sla_searches
from servetune.errors import ServetuneError
from servetune.export import engine_config_from_params, model_argument, serve_command
from servetune.paths import resolve_experiment_dir
from servetune.schema import DATASET_FILE, QUANTILE_VARIABLES
from servetune.simulated import export_provenance, sim_profile, simulated_label

RECORD_FILE = "decision.json"
RECORD_VERSION = 1


def parse_weights(text: str | None) -> dict[str, float] | None:
    """``"burst=3,steady=1"`` -> ``{"burst": 3.0, "steady": 1.0}``; AnalysisInputError names a bad item."""
    if text is None:
        return None
    out: dict[str, float] = {}
    for item in text.split(","):
        lp, sep, value = item.strip().rpartition("=")
        try:
            w = float(value)
        except ValueError:
            w = float("nan")
        if not sep or not lp or not w == w:
            raise AnalysisInputError(f"--weights item {item!r}: expected LOAD_POINT=WEIGHT")
        out[lp] = w
    return out


def parse_slo(text: str) -> dict[str, Any]:
    """``"ttft_ms_p99<=200"`` (or ``ttft_ms<=200``: 99th percentile) -> an SLO dict."""
    col, sep, value = text.partition("<=")
    col = col.strip()
    try:
        bound = float(value)
    except ValueError:
        bound = float("nan")
    if not sep or not bound == bound or bound < 0 or bound == float("inf"):
        raise AnalysisInputError(f"--slo {text!r}: expected METRIC<=VALUE with VALUE >= 0, e.g. ttft_ms_p99<=200")
    metric, pct = col, 99.0
    base, us, q = col.rpartition("_p")
    if us and base in QUANTILE_VARIABLES:
        try:
            metric, pct = base, float(q)
        except ValueError:
            metric = col
    if metric not in QUANTILE_VARIABLES or not 0 < pct <= 100:
        raise AnalysisInputError(f"--slo {text!r}: unknown metric {col!r}; known: "
                                 + ", ".join(f"{v}[_pNN]" for v in QUANTILE_VARIABLES))
    return {"metric": metric, "percentile": pct, "max_ms": bound}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m coordinator recommend",
                                     description="recommend one engine config per hardware class")
    parser.add_argument("experiment", metavar="EXPERIMENT", help="name, folder or spec file")
    parser.add_argument("--results-root", type=Path, default=None, help="default: $SERVETUNE_RESULTS_ROOT or ./runs")
    parser.add_argument("--weights", default=None, help="traffic mix LOAD_POINT=W,... (default: equal)")
    parser.add_argument("--slo", action="append", default=None, metavar="METRIC<=VALUE",
                        help="an SLO that must hold, e.g. ttft_ms_p99<=200 (repeat; default: the spec's)")
    parser.add_argument("--rule", choices=tuple(RULES), default="weighted")
    parser.add_argument("--include-drift", action="store_true", help="keep drift-suspect trials (default: left out)")
    parser.add_argument("--json", action="store_true", help="print the decision record")
    parser.add_argument("--n-boot", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cross-hardware", choices=tuple(CROSS_MODES), default=None,
                        help="one decision across hardware classes on a normalised objective (labelled)")
    parser.add_argument("--gpu-hour-price", action="append", default=[], metavar="CLASS=USD")
    parser.add_argument("--model", default=None, help="model path or hub id for the vllm serve command")
    return parser


def record(decision: Decision, inputs: dict[str, Any], dataset_sha256: str) -> dict[str, Any]:
    """The decision record: a versioned JSON document."""
    doc = jsonable(decision)
    doc["dataset"]["results_sha256"] = dataset_sha256
    return {"record_version": RECORD_VERSION, "inputs": inputs, **doc}


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def human(decision: Decision, commands: dict[str, str], path: Path) -> str:
    lines = [f"rule: {decision.rule_text}", f"SLO check: {decision.slo_rule}",
             "weights: " + ", ".join(f"{k}={v:g}" for k, v in decision.weights.items()),
             f"objective: {decision.objective}; mode: {decision.mode}"]
    if decision.dataset.get("synthetic"):
        lines.insert(0, "SYNTHETIC data: nothing here was measured")
    if decision.dataset.get("simulated"):
        lines.insert(0, f"{decision.dataset['simulated']}: a model's expectation, nothing here was measured")
    apart = [c for c in decision.sla if c not in decision.classes]
    for c in [*decision.classes, *apart]:
        lines.append("")
        if c in apart:
            lines.append("SLA search load points, decided apart on max rate at SLO:")
        profile = sim_profile(c.hardware_class)
        lines.append((f"{simulated_label([c.hardware_class])}: " if profile else "") + c.sentence)
        if c.winner is not None and c.winner.config_id in commands:
            lines.append(commands[c.winner.config_id])
        lines.append(f"  feasible {c.n_feasible} of {c.n_configs} configs; excluded: "
                     + ", ".join(f"{k} {v}" for k, v in c.excluded.items()))
        for who in ("winner", "runner_up"):
            ev = dict(c.evidence.get(who) or {})
            if ev:
                reps = ", ".join(f"{lp} {n}" for lp, n in ev.pop("repeats", {}).items())
                runs = ", ".join(f"{lp} {n}" for lp, n in ev.pop("runs", {}).items())
                rest = ", ".join(f"{k.replace('_', ' ')} {', '.join(v) if isinstance(v, list) else v}"
                                 for k, v in ev.items())
                head = f"repeats {reps}" if reps else f"runs {runs}"
                lines.append(f"  evidence ({who.replace('_', '-')}): {head}; {rest}")
        for t in c.thresholds:
            lines.append(f"  what would change it: {t.sentence}")
    for w in decision.warnings:
        lines.append(f"warning [{w.code}] {w.message}" + (f" ({w.subject})" if w.subject else ""))
    lines.append(f"decision record: {path}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        direct = Path(args.experiment)
        folder = direct.parent if direct.suffix == ".nc" and direct.is_file() else resolve_experiment_dir(
            args.experiment, args.results_root, dataset_only=True)
        ds = load(args.experiment, args.results_root)
        weights = parse_weights(args.weights)
        slos = [parse_slo(s) for s in args.slo] if args.slo is not None else None
        sla = read_sla_searches(folder, trial_table(ds), str(ds.attrs.get("spec_hash", "")))
        decision = recommend(ds, weights=weights, slos=slos, rule=args.rule, include_drift=args.include_drift,
                             n_boot=args.n_boot, seed=args.seed, cross_hardware=args.cross_hardware,
                             prices=parse_prices(args.gpu_hour_price), sla=sla)
        commands: dict[str, str] = {}
        identity = json.loads(str(ds.attrs.get("model", "") or "{}"))
        marg = model_argument(identity if isinstance(identity, dict) else {}, args.model)
        for c in [*decision.classes, *decision.sla] if decision.mode == "per-class" else []:
            if c.winner is not None and c.winner.config_id not in commands:
                params = serve_params(ds, c.winner.config_id)
                prov = {"experiment": ds.attrs.get("experiment", ""), "config": c.winner.config_id[:16],
                        "spec": str(ds.attrs.get("spec_hash", ""))[:12], "decision": RECORD_FILE}
                prov = export_provenance(prov, [c.hardware_class])  # a simulated winner says so first
                commands[c.winner.config_id] = serve_command(engine_config_from_params(params), marg,
                                                             provenance=prov).text()
    except (AnalysisInputError, ServetuneError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    nc = folder / DATASET_FILE
    sha = hashlib.sha256(nc.read_bytes()).hexdigest() if nc.is_file() else ""
    inputs = {"experiment": str(args.experiment), "weights": weights, "slos": slos, "rule": args.rule,
              "include_drift": args.include_drift, "n_boot": args.n_boot, "seed": args.seed,
              "cross_hardware": args.cross_hardware}
    doc = record(decision, inputs, sha)
    doc["serve_commands"] = commands
    text = json.dumps(doc, indent=1, allow_nan=False)
    path = folder / RECORD_FILE
    write_atomic(path, text + "\n")
    print(text if args.json else human(decision, commands, path))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
