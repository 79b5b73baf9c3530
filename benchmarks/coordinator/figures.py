"""The figures of one run, from what the FAKE fleet recorded, the coordinator's log and the samplers.

Pure: no processes, no sockets. Definitions:

- **completions/s**: results ACKed per second over the steady part of the run, the span between
  the 10th and the 90th percentile of the ACK times the fake daemons saw (start-up, the last
  stragglers and the wait for the probe's lease are outside it).
- **grant latency**: READY sent -> GRANT received, per grant (READYs answered NO_WORK are not
  grants); **heartbeat round trip**: HEARTBEAT sent -> its RENEWED received.
- **coordinator CPU per completion**: the coordinator's CPU-seconds (utime + stime, ``/proc``)
  over the steady span / results ACKed in it; **core busy**: those CPU-seconds / the span.
- **held**: every daemon was WELCOMEd, none was told REJOIN, none had a lease revoked, none was
  ever suspected, none went longer than ``suspect_after`` heartbeat intervals without a RENEWED,
  none had to fence a lease or refuse a GRANT that came too late, and no result was STALE.
- **probe**: from the frozen daemon's last message (its READY or a heartbeat) to the
  coordinator's last ``daemon X suspected`` log line about it (the one after which it is never
  heard from again); from the GRANT it froze on (the lease's start, its
  last renewal) to the moment another fake daemon received the same trials at attempt + 1.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from benchmarks.coordinator.coord import FleetTimings, LogSummary

SUSPECT_AFTER_MISSED = 3  # coordinator.fleet.FleetSettings.suspect_after_missed (its default; not passed)


def quantile(xs: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile (numpy's default); NaN when empty."""
    if not xs:
        return math.nan
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def steady_window(ack_mono: Sequence[float], lo: float = 0.1, hi: float = 0.9) -> tuple[float, float, int]:
    """(start, end, ACKs inside) of the span between the ``lo`` and ``hi`` quantiles of the ACK times."""
    s = sorted(ack_mono)
    if len(s) < 10:
        return (s[0], s[-1], len(s)) if s else (math.nan, math.nan, 0)
    a, b = s[int(lo * (len(s) - 1))], s[int(hi * (len(s) - 1))]
    return a, b, sum(1 for t in s if a <= t <= b)


def merge_fleets(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One record out of those of several client processes."""
    out: dict[str, Any] = {"ack_mono": [], "grant_latency_s": [], "grant_wait_s": [], "hb_rtt_s": [], "regrants": [],
                           "daemons": [],
                           "unexpected": [], "n_unexpected": 0, "no_work": 0, "cpu_s": 0.0, "victim": None,
                           "started_mono": min(r["started_mono"] for r in records), "shutdown_reasons": {}}
    for r in records:
        for key in ("ack_mono", "grant_latency_s", "grant_wait_s", "hb_rtt_s", "regrants", "daemons", "unexpected"):
            out[key] += r.get(key, [])
        out["n_unexpected"] += r["n_unexpected"]
        out["no_work"] += r["no_work"]
        out["cpu_s"] += r["cpu_s"]
        out["victim"] = out["victim"] or r["victim"]
        for k, v in r["shutdown_reasons"].items():
            out["shutdown_reasons"][k] = out["shutdown_reasons"].get(k, 0) + v
    return out


def probe_figures(fleet: dict[str, Any], log: LogSummary, timings: FleetTimings) -> dict[str, Any]:
    victim = fleet["victim"]
    if victim is None:
        return {"ran": False}
    vid = victim["daemon_id"]
    out: dict[str, Any] = {"ran": True, "daemon_id": vid, "batch_id": victim["batch_id"], "epoch": victim["epoch"]}
    # The suspicion that stuck: the last one (an earlier one can be a stall of the coordinator's loop
    # that ended when it read the victim's last messages, "heard from again").
    suspected = [t for t in log.suspected.get(vid, []) if t >= victim["last_send_wall"]]
    out["times_suspected_after_freeze"] = len(suspected)
    if suspected:
        out["suspected_after_s"] = suspected[-1] - victim["last_send_wall"]
        out["suspected_after_intervals"] = out["suspected_after_s"] / timings.heartbeat_s
    expired = [t for t, _, d in log.lease_expired if d == vid]
    if expired:
        out["revoked_after_s"] = expired[0] - victim["grant_wall"]
    wanted = {(t, a + 1) for t, a in victim["trials"]}
    for g in sorted(fleet["regrants"], key=lambda g: g["mono"]):
        if wanted & {(t, a) for t, a in g["trials"]}:
            out["regranted_after_s"] = g["mono"] - victim["grant_mono"]
            out["regranted_to"] = g["daemon_id"]
            out["regranted_epoch"] = max(a for _, a in g["trials"])
            break
    revoke_after = timings.ttl_s + timings.grace_s
    out["revoke_after_s_setting"] = revoke_after
    out["suspect_met"] = "suspected_after_s" in out and out["suspected_after_s"] <= SUSPECT_AFTER_MISSED * timings.heartbeat_s
    out["suspect_met_lenient"] = ("suspected_after_s" in out
                                  and out["suspected_after_s"] <= (SUSPECT_AFTER_MISSED + 1) * timings.heartbeat_s)
    out["regrant_met"] = "regranted_after_s" in out and out["regranted_after_s"] <= revoke_after
    out["regrant_met_lenient"] = ("regranted_after_s" in out
                                  and out["regranted_after_s"] <= revoke_after + timings.heartbeat_s)
    return out


def run_figures(fleet: dict[str, Any], log: LogSummary, timings: FleetTimings, coord_cpu: Any, client_cpu: Any,
                coord_mem: Any, n_daemons: int, expected_trials: int) -> dict[str, Any]:
    """Every figure of one run (see the module docstring). ``coord_cpu``/``client_cpu``:
    :class:`benchmarks.loadgen.cpu.TreeCPU`; ``coord_mem``: :class:`.coord.ProcSampler`."""
    acks = fleet["ack_mono"]
    start, end, inside = steady_window(acks)
    span = end - start if inside else math.nan
    rate = inside / span if span and span > 0 else math.nan
    coord_cpu_s = coord_cpu.between(start, end, "mono") if inside else math.nan
    client_cpu_s = client_cpu.between(start, end, "mono") if inside else math.nan
    victim = (fleet["victim"] or {}).get("daemon_id")
    others = [d for d in fleet["daemons"] if d["daemon_id"] != victim]
    suspect_s = SUSPECT_AFTER_MISSED * timings.heartbeat_s
    false_suspects = sorted(d for d in log.suspected if d != victim)
    gaps = [d["max_renewed_gap_s"] for d in others]
    held = {
        "welcomed": sum(d["welcomed"] for d in fleet["daemons"]),
        "rejoins": sum(d["rejoins"] for d in others),
        "revoked_leases": sum(d["revoked"] for d in others),
        "revoked_after_ack": sum(d.get("revoked_answered", 0) for d in others),
        "stale": sum(d["stale"] for d in others),
        "conflict": sum(d["conflict"] for d in others),
        "lapsed_leases": sum(d["lapsed"] for d in others),
        "late_grants": sum(d.get("late_grants", 0) for d in others),
        "ready_resends": sum(d.get("ready_resends", 0) for d in others),
        "grants_unmatched": sum(d.get("grants_unmatched", 0) for d in others),
        "result_resends": sum(d.get("result_resends", 0) for d in others),
        "max_renewed_gap_s": max(gaps) if gaps else math.nan,
        "daemons_gap_over_suspect": sum(1 for g in gaps if g > suspect_s),
        "false_suspicions": len(false_suspects),
        "false_suspect_ids": false_suspects[:10],
        "shut_down": sum(d["done"] for d in others),
    }
    held["all_held"] = (held["welcomed"] == n_daemons and held["rejoins"] == 0 and held["revoked_leases"] == 0
                        and held["false_suspicions"] == 0 and held["daemons_gap_over_suspect"] == 0
                        and held["lapsed_leases"] == 0 and held["late_grants"] == 0 and held["stale"] == 0)
    busy = [d for d in others if d["grants"] > 0]
    return {
        "n_daemons": n_daemons,
        "trials": expected_trials,
        "acked": len(acks),
        "daemons_granted": len(busy),
        "steady_s": span,
        "steady_acks": inside,
        "completions_per_s": rate,
        "run_s": (max(acks) - fleet["started_mono"]) if acks else math.nan,
        "grants": len(fleet["grant_latency_s"]),
        "grant_p50_ms": 1000 * quantile(fleet["grant_latency_s"], 0.5),
        "grant_p99_ms": 1000 * quantile(fleet["grant_latency_s"], 0.99),
        "grant_max_ms": 1000 * max(fleet["grant_latency_s"], default=math.nan),
        "grant_wait_p50_ms": 1000 * quantile(fleet.get("grant_wait_s", []), 0.5),
        "grant_wait_p99_ms": 1000 * quantile(fleet.get("grant_wait_s", []), 0.99),
        "hb_rtt_p50_ms": 1000 * quantile(fleet["hb_rtt_s"], 0.5),
        "hb_rtt_p99_ms": 1000 * quantile(fleet["hb_rtt_s"], 0.99),
        "hb_rtt_max_ms": 1000 * max(fleet["hb_rtt_s"], default=math.nan),
        "coord_cpu_ms_per_completion": 1000 * coord_cpu_s / inside if inside else math.nan,
        "coord_core_busy": coord_cpu_s / span if span and span > 0 else math.nan,
        "client_core_busy": client_cpu_s / span if span and span > 0 else math.nan,
        "coord_rss_peak_mib": coord_mem.hwm_mib,
        # the coordinator and its results.nc writer child(ren), read together every 0.1 s; and the
        # bound that adds the two peaks (VmHWM) whether or not they coincided
        "tree_rss_peak_mib": coord_mem.tree_rss_peak_mib,
        "tree_hwm_bound_mib": coord_mem.hwm_mib + coord_mem.children_hwm_mib,
        "coord_rss_steady_max_mib": coord_mem.max_between(start, end),
        "no_work": fleet["no_work"],
        "stale_total": sum(d["stale"] for d in fleet["daemons"]),
        "heartbeats_sent": sum(d["heartbeats"] for d in fleet["daemons"]),
        "renewed_received": sum(d["renewed"] for d in fleet["daemons"]),
        "unexpected": fleet["unexpected"][:10],
        "n_unexpected": fleet["n_unexpected"],
        "held": held,
        "probe": probe_figures(fleet, log, timings),
        "coord_warnings": log.warnings,
        "coord_errors": log.errors[:10],
    }
