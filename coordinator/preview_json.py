"""``sweep CONFIG --preview --json``: the SIMULATED preview as one JSON document (``preview.schema.json``).

The same figures as the text (:func:`coordinator.preview.print_preview`), from the same
:class:`~coordinator.preview.TargetPreview` objects, so the two cannot disagree: per target and load
point the ranked configs, the expected winner (:func:`coordinator.preview.expected_winner`) and the
Pareto front; the configs that would not start with vLLM's wording; the rate sweeps' follow-up
load points; the server starts and the wall-clock, GPU-hour and money cost. Every object that
carries a figure is marked as the text is: ``simulated`` (always ``"SIMULATED"``), ``profile``
and ``calibration`` (``"uncalibrated (from published specs)"`` for GPU profiles). A value the
simulation could not give is ``null``, never NaN.

The document is made whole before anything is written, then written to stdout in one call
(:func:`write_document`): a preview that fails writes nothing there (its error goes to stderr).
The schema (JSON Schema 2020-12) lives next to this module and is checked by the tests.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from coordinator.preview import (
    CPU_START_S,
    GPU_START_BASE_S,
    SIMULATED,
    TRIAL_OVERHEAD_S,
    WEIGHT_LOAD_BYTES_S,
    TargetPreview,
    expected_winner,
)
from servetune.ranking import RankedConfig
from servetune.spec import DERIVED_MARK, ExperimentSpec

PREVIEW_VERSION = 1
SCHEMA_PATH = Path(__file__).with_name("preview.schema.json")
STATEMENT = ("noiseless expected values from the simulated vLLM, not measurements; no server was started and "
             "nothing was written")


def _num(value: Any) -> float | int | None:
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, float) and math.isnan(value):
        return None
    return value if isinstance(value, (int, float)) else None


def _mark(pv: TargetPreview) -> dict[str, str]:
    return {"simulated": SIMULATED, "profile": pv.target.profile, "calibration": pv.calibration}


def _row(r: RankedConfig, front: set[str]) -> dict[str, Any]:
    return {"rank": r.rank, "config_id": r.config_id, "config_label": r.config_label, "status": r.status,
            "failure": r.failure, "slos_met": r.slos_met, "on_front": r.config_id in front,
            "values": {k: _num(v) for k, v in r.values.items()}}


def _kind(pv: TargetPreview, lp: str) -> tuple[str, str | None]:
    if lp in pv.followup_of:
        return "rate_sweep_followup", pv.followup_of[lp]
    if DERIVED_MARK in lp:
        return "rate_sweep_seed", lp.split(DERIVED_MARK, 1)[0]
    return "planned", None


def _load_point(spec: ExperimentSpec, pv: TargetPreview, lp: str, rows: Sequence[RankedConfig]) -> dict[str, Any]:
    objective = spec.ranking.objective
    front = pv.fronts.get(lp, [])
    best = expected_winner(rows, spec.ranking)
    rest = rows[0] if best is None and rows and rows[0].n_ok else None
    kind, sweep = _kind(pv, lp)
    return {**_mark(pv), "load_point": lp, "kind": kind, "rate_sweep": sweep,
            "winner": None if best is None else {"config_id": best.config_id, "config_label": best.config_label,
                                                 "objective_value": _num(best.values.get(objective))},
            "best_of_the_rest": None if rest is None else {"config_id": rest.config_id,
                                                           "config_label": rest.config_label},
            "front": [{"config_id": r.config_id, "config_label": r.config_label,
                       "objective_value": _num(r.values.get(objective)),
                       "ttft_p99_ms": _num(r.values.get("ttft_p99_ms"))} for r in front],
            "configs": [_row(r, {f.config_id for f in front}) for r in rows]}


def _target(spec: ExperimentSpec, pv: TargetPreview) -> dict[str, Any]:
    followups_of: dict[tuple[str, str], list[str]] = {}
    for lp, parent in pv.followup_of.items():
        for r in pv.ranked.get(lp, []):
            followups_of.setdefault((r.config_id, parent), []).append(lp)
    return {
        **_mark(pv), "hardware_target": pv.target.label, "model_shape": pv.target.shape,
        "profile_from": pv.target.why,
        "load_points": [_load_point(spec, pv, lp, rows) for lp, rows in pv.ranked.items()],
        "rate_sweeps": [{**_mark(pv), "load_point": s["load_point"], "config_id": s["config_id"],
                         "config_label": s["config_label"], "sync_rps": _num(s["sync_rps"]),
                         "max_rps": _num(s["max_rps"]), "rates": list(s["rates"]),
                         "followup_load_points": followups_of.get((s["config_id"], s["load_point"]), [])}
                        for s in pv.rate_sweeps],
        "failures": [{**_mark(pv), "config_label": label, "reason": reason} for label, reason in pv.failures.items()],
        "cost": {**_mark(pv), "server_starts": pv.server_starts, "followup_server_starts": pv.followup_starts,
                 "trials": pv.trials, "followup_trials": pv.followup_trials, "wall_s": pv.wall_s,
                 "gpu_hours": pv.gpu_hours if pv.is_gpu else None, "cost_usd": _num(pv.cost_usd)},
        "notes": list(pv.notes),
    }


def preview_document(spec: ExperimentSpec, previews: Sequence[TargetPreview]) -> dict[str, Any]:
    """The JSON document of ``previews`` (see ``preview.schema.json``)."""
    return {
        "preview_version": PREVIEW_VERSION, "simulated": SIMULATED, "statement": STATEMENT, "experiment": spec.name,
        "objective": spec.ranking.objective, "require_slos": spec.ranking.require_slos,
        "slos": [{"metric": s.metric, "percentile": s.percentile, "max_ms": s.max_ms} for s in spec.slos],
        "assumptions": {"cpu_server_start_s": CPU_START_S, "gpu_server_start_base_s": GPU_START_BASE_S,
                        "weight_load_bytes_s": WEIGHT_LOAD_BYTES_S, "trial_overhead_s": TRIAL_OVERHEAD_S},
        "targets": [_target(spec, pv) for pv in previews],
    }


def write_document(doc: dict[str, Any], out: IO[str] | None = None) -> None:
    """Serialise ``doc`` whole (NaN refused), then write it in one call and flush."""
    text = json.dumps(doc, indent=1, allow_nan=False) + "\n"
    stream = out or sys.stdout
    stream.write(text)
    stream.flush()
