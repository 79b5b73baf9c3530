"""The sweep's side of an SLA search (``load_points[*].sla_search``): after each round of one engine
config's search, decide the next round (:func:`servetune.sla.next_rates`) and queue its rates as new
trials, one batch (one server start) per round.

Nothing here is state of its own: every round is a function of the rounds before it and their
results in the store, so a resumed sweep re-derives the same rounds (the same trial ids) and runs
what is missing. Round 0 is in the plan; round ``r >= 1`` of the plan's batch ``i`` is recorded
under batch index ``SLA_BATCH_OFFSET * r + i``. A probe lost to transport is not finished (it is run
again) and holds its round open; one that failed as a measurement counts as missing the SLOs.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from coordinator.leases import BatchWork
from coordinator.planning import needs_run
from coordinator.store import Store
from servetune.manifest import Plan, PlannedBatch, TrialManifest, sla_points, sweep_parent, swept_names
from servetune.sla import SlaOutcome, Verdict, boundary, combine_runs, next_rates, search_range, verdict
from servetune.spec import ExperimentSpec, LoadPoint

log = logging.getLogger(__name__)

#: Batch index of round r (>= 1) of the plan's batch i: SLA_BATCH_OFFSET * r + i.
SLA_BATCH_OFFSET = 1_000_000


@dataclass(frozen=True)
class SearchState:
    """One (planned batch, SLA load point) search: its rounds so far and where it stands."""

    batch: PlannedBatch
    parent: str
    rounds: tuple[tuple[TrialManifest, ...], ...]
    outcome: SlaOutcome
    #: the next round's manifests when the search goes on and they are not all finished yet (else empty)
    pending: tuple[TrialManifest, ...] = ()
    #: the round ``pending`` belongs to
    pending_round: int = 0


def _searches(spec: ExperimentSpec, plan: Plan) -> Iterable[tuple[PlannedBatch, LoadPoint, tuple[TrialManifest, ...]]]:
    parents = {lp.name: lp for lp in spec.load_points if lp.sla_search is not None}
    if not parents:
        return
    for batch in plan.batches:
        groups: dict[str, list[TrialManifest]] = {}
        for m in batch.trials:
            parent = sweep_parent(m.load_point.name)
            if parent in parents:
                groups.setdefault(parent, []).append(m)
        for parent, ms in groups.items():
            yield batch, parents[parent], tuple(ms)


def search_states(store: Store, spec: ExperimentSpec, plan: Plan, spec_hash: str, retry_failed: bool = False,
                  record: bool = True) -> list[SearchState]:
    """Every SLA search of ``plan``, replayed from the store's results. With ``record``, a round
    decided here for the first time is recorded in the store (its trials made now, never changed)."""
    out = []
    for batch, lp, first in _searches(spec, plan):
        s = lp.sla_search
        assert s is not None
        rounds = [first]
        probes: dict[float, Verdict] = {}
        while True:
            current = rounds[-1]
            latest = store.latest_finished_of([m.trial_id for m in current])
            if any(needs_run(latest.get(m.trial_id), retry_failed) for m in current):
                pending = current
                break
            for m in current:
                att = latest[m.trial_id]
                rate = m.load_point.request_rate
                assert rate is not None
                probes[rate] = verdict(att.status, att.metrics)
            floor, ceiling = search_range(s.min_rps, s.max_rps)
            rates, outcome = next_rates(probes, per_round=s.rates_per_round, rel_tol=s.rel_tol,
                                        rounds_done=len(rounds), max_rounds=s.max_rounds, floor=floor, ceiling=ceiling)
            if not rates:
                out.append(SearchState(batch, lp.name, tuple(rounds), outcome))
                pending = ()
                break
            manifests = tuple(first[0].model_copy(update={"load_point": p}) for p in sla_points(lp, rates))
            if record:
                store.add_trials(spec_hash, list(manifests), SLA_BATCH_OFFSET * len(rounds) + batch.index)
            rounds.append(manifests)
        if pending:
            out.append(SearchState(batch, lp.name, tuple(rounds), boundary(list(probes.items())),
                                   pending=pending, pending_round=len(rounds) - 1))
    return out


def expand_sla_searches(store: Store, spec: ExperimentSpec, plan: Plan, spec_hash: str, retry_failed: bool = False,
                        only: set[str] | None = None) -> list[BatchWork]:
    """The batches of SLA-search rounds after the first that have something to run (one per search
    with an open round): decided from the results so far, recorded in the store. ``only``: just the
    searches one of these trial ids belongs to, and only when it finished a round: a round with one of
    them in it is in flight, queued when it was decided (queued again, its other trials would run twice)."""
    work = []
    for st in search_states(store, spec, plan, spec_hash, retry_failed):
        if not st.pending or st.pending_round == 0:
            continue  # round 0 is the plan's own batch
        if only is not None and not any(m.trial_id in only for r in st.rounds for m in r):
            continue
        if only is not None and any(m.trial_id in only for m in st.pending):
            continue
        latest = store.latest_finished_of([m.trial_id for m in st.pending])
        todo = tuple(m for m in st.pending if needs_run(latest.get(m.trial_id), retry_failed))
        if todo:
            index = SLA_BATCH_OFFSET * st.pending_round + st.batch.index
            planned = PlannedBatch(index=index, config=st.batch.config, trials=st.pending,
                                   is_baseline=st.batch.is_baseline)
            work.append(BatchWork(batch=planned, trials=todo))
    return work


def by_config(states: Iterable[SearchState]) -> dict[tuple[str, str, str | None], list[SearchState]]:
    """The searches of each (engine config, SLA load point, hardware target), one per repeat (a run)."""
    out: dict[tuple[str, str, str | None], list[SearchState]] = {}
    for st in states:
        out.setdefault((st.batch.config_id, st.parent, st.batch.hardware_target), []).append(st)
    return out


#: The SLA searches' answer, beside the dataset: ``runs/<name>/sla_search.json``.
SLA_FILE = "sla_search.json"


def _run_doc(st: SearchState) -> dict[str, Any]:
    o = st.outcome
    trial_of = {m.load_point.request_rate: m.trial_id for r in st.rounds for m in r}
    return {"repeat": st.batch.trials[0].repeat if st.batch.trials else 0, "max_rate_at_slo_rps": o.lo,
            "bracket_low_rps": o.lo if o.lo is not None else 0.0, "bracket_high_rps": o.hi,
            "stopped": o.reason or "still searching", "non_monotone": o.non_monotone, "rounds": len(st.rounds),
            "probes": [{"rate_rps": r, "verdict": v, "trial_id": trial_of.get(r)} for r, v in o.probes]}


def write_sla_file(folder: Path, states: list[SearchState], spec: ExperimentSpec, spec_hash: str,
                   swept: list[str] | None) -> Path | None:
    """``folder/sla_search.json`` (atomically: a temporary file, then ``os.replace``): per engine
    config and SLA load point, its runs combined (:func:`servetune.sla.combine_runs`) and every run's
    search: its bracket, why it stopped, every rate probed with its verdict and trial id. Rewritten
    whole at each sweep's end; None when there is no search."""
    if not states:
        return None
    searches = []
    for (config_id, parent, target), runs in by_config(states).items():
        combined = combine_runs([st.outcome for st in runs])
        searches.append({
            "config_id": config_id, "config_label": runs[0].batch.config.label(swept), "load_point": parent,
            "hardware_target": target, "runs": len(runs), "met_in_every_run_rps": combined.met_in_every_run,
            "boundary_estimate_rps": combined.estimate, "boundary_ci95_rps": (
                [combined.low, combined.high] if combined.low is not None else None),
            "summary": combined.describe(), "per_run": [_run_doc(st) for st in runs],
        })
    doc = {"spec_hash": spec_hash, "slos": [s.model_dump(mode="json") for s in spec.slos],
           "meaning": "per run: max_rate_at_slo_rps is the highest rate whose trial met every SLO beyond the "
                      "sampling error of each percentile, below every rate that missed (null: none met); that run's "
                      "boundary lies in [bracket_low_rps, bracket_high_rps] if latency rises with rate. Over runs "
                      "(repeats >= 2): boundary_ci95_rps is a 95% t-interval on the typical run's boundary; "
                      "one run's bracket does not include run-to-run variation",
           "searches": searches}
    path = folder / SLA_FILE
    tmp = folder / f".{SLA_FILE}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=1, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return path


def print_sla(store: Store, spec: ExperimentSpec, plan: Plan, spec_hash: str, console: Console,
              retry_failed: bool = False, folder: Path | None = None) -> list[SearchState]:
    """The SLA searches' table: per engine config and SLA load point, the max rate at SLO met in
    every run, each run's bracket and, over two or more runs (repeats), the 95% interval on the
    boundary; ranked by the max rate met in every run. Nothing is recorded (``record=False``)."""
    states = search_states(store, spec, plan, spec_hash, retry_failed, record=False)
    if not states:
        return states
    swept = swept_names(plan.configs().values()) or None
    slo_text = "; ".join(f"{s.metric} p{s.percentile:g} <= {s.max_ms:g} ms" for s in spec.slos)
    table = Table(title=escape(f"SLA search: max request rate meeting every SLO ({slo_text}), per engine config"))
    for col, justify in [("rank", "right"), ("engine config", "left"), ("load point", "left"),
                         ("max rate at SLO", "right"), ("each run's bracket", "right"),
                         ("boundary, 95% over runs", "right"), ("trials", "right"), ("rounds", "right"),
                         ("stopped", "left")]:
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    groups = by_config(states)
    combined = {key: combine_runs([st.outcome for st in runs]) for key, runs in groups.items()}
    ordered = sorted(groups, key=lambda k: -(combined[k].met_in_every_run or 0.0))
    one_run = False
    for rank, key in enumerate(ordered, start=1):
        runs, c = groups[key], combined[key]
        brackets = ", ".join(f"[{st.outcome.lo or 0:g}, {st.outcome.hi:g}]" if st.outcome.hi is not None
                             else f"[{st.outcome.lo or 0:g}, inf)" for st in runs)
        over = f"{c.estimate:.3g} [{c.low:.3g}, {c.high:.3g}]" if c.low is not None and c.estimate is not None else "-"
        one_run = one_run or len(runs) == 1
        why = ", ".join(dict.fromkeys((st.outcome.reason or "still searching")
                                      + (", not monotone" if st.outcome.non_monotone else "") for st in runs))
        label = runs[0].batch.config.label(swept) + (f" @{key[2]}" if key[2] else "")
        table.add_row(str(rank), label, key[1],
                      f"{c.met_in_every_run:g} req/s" if c.met_in_every_run is not None else "none", brackets, over,
                      str(sum(len(r) for st in runs for r in st.rounds)), str(sum(len(st.rounds) for st in runs)), why)
    console.print(table)
    console.print("max rate at SLO: the highest rate whose trial met every SLO beyond the sampling error of each "
                  "percentile, below every rate that missed, in every run; a run's bracket holds that run's "
                  "boundary if latency rises with rate (servetune.sla)")
    if one_run:
        console.print("caveat: one run per config: a server start's own speed moves the boundary from run to run, "
                      "and one run's bracket cannot show by how much; `repeats: 3` gives an interval over runs")
    if folder is not None:
        try:
            console.print(f"SLA searches: {write_sla_file(folder, states, spec, spec_hash, swept)}")
        except OSError as exc:  # the store holds every probe: the file can be written by the next resume
            log.warning("cannot write %s: %s", folder / SLA_FILE, exc)
    return states
