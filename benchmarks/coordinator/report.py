"""Tables of the coordinator benchmark: per run, per fleet size (medians and ranges), the
targets, the py-spy profile; and its section of ``benchmarks/RESULTS.md``."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks import common

BEGIN = "<!-- coordinator:begin (written by `python -m benchmarks.coordinator --results ...`; edits inside are overwritten) -->"
END = "<!-- coordinator:end -->"
MIB_TO_MB = 1.048576

TARGET_DAEMONS = 1000
TARGET_RATE = 2000.0
TARGET_RSS_MB = 500.0


def _f(x: Any, fmt: str = ".0f") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return format(x, fmt)


def one_line(f: dict[str, Any]) -> str:
    p, h = f["probe"], f["held"]
    probe = (f"suspected after {_f(p.get('suspected_after_s'), '.2f')} s, re-granted after "
             f"{_f(p.get('regranted_after_s'), '.2f')} s" if p.get("ran") else "no probe")
    return (f"{f['n_daemons']} daemons: {_f(f['completions_per_s'])} completions/s, grant p50/p99 "
            f"{_f(f['grant_p50_ms'], '.1f')}/{_f(f['grant_p99_ms'], '.1f')} ms, coordinator "
            f"{_f(f['coord_cpu_ms_per_completion'], '.2f')} CPU-ms/completion ({_f(100 * f['coord_core_busy'])}% busy), "
            f"RSS peak {_f(f['coord_rss_peak_mib'] * MIB_TO_MB)} MB (with its children: "
            f"{_f(f.get('tree_rss_peak_mib', math.nan) * MIB_TO_MB)} MB together, "
            f"{_f(f.get('tree_hwm_bound_mib', math.nan) * MIB_TO_MB)} MB adding peaks), held {h['all_held']} "
            f"({h['welcomed']}/{f['n_daemons']} welcomed, {h['false_suspicions']} false suspicions), {probe}; "
            f"{'finished' if f.get('finished', True) else 'NOT FINISHED (stopped)'}, exit {f['coord_exit']}, "
            f"store {f['store']['attempts']}, {f['store']['holes']} holes")


def _stat(runs: Sequence[dict[str, Any]], get: Callable[[dict[str, Any]], Any], fmt: str) -> str:
    xs = [v for v in (get(r) for r in runs) if v is not None and not (isinstance(v, float) and math.isnan(v))]
    if not xs:
        return "-"
    med = common.median(xs)
    if len(xs) == 1 or min(xs) == max(xs):
        return _f(med, fmt)
    return f"{_f(med, fmt)} ({_f(min(xs), fmt)}-{_f(max(xs), fmt)})"


def by_size(result: dict[str, Any]) -> dict[int, list[dict[str, Any]]]:
    out: dict[int, list[dict[str, Any]]] = {}
    for r in result["runs"]:
        if not r.get("profile"):
            out.setdefault(r["n_daemons"], []).append(r)
    return out


def _held(runs: Sequence[dict[str, Any]]) -> str:
    ok = sum(r["held"]["all_held"] for r in runs)
    return f"{ok}/{len(runs)} runs"


def size_table(result: dict[str, Any]) -> list[str]:
    rows = [
        "| FAKE daemons | runs | completions/s (steady) | grant latency p50 / p99 (ms) | heartbeat round trip p50 / p99 (ms) "
        "| coordinator CPU-ms per completion | coordinator core busy | client core busy | coordinator RSS peak (MB) "
        "| all daemons held | max gap between RENEWEDs (s) | daemons falsely suspected | sweeps finished "
        "| dead daemon suspected after (s) | its trials re-granted after (s) |",
        "| ---: | ---: | ---: | --- | --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | --- | ---: | ---: |",
    ]
    for n, runs in sorted(by_size(result).items()):
        rows.append(
            f"| {n} | {len(runs)} | {_stat(runs, lambda r: r['completions_per_s'], '.0f')} "
            f"| {_stat(runs, lambda r: r['grant_p50_ms'], '.1f')} / {_stat(runs, lambda r: r['grant_p99_ms'], '.1f')} "
            f"| {_stat(runs, lambda r: r['hb_rtt_p50_ms'], '.1f')} / {_stat(runs, lambda r: r['hb_rtt_p99_ms'], '.1f')} "
            f"| {_stat(runs, lambda r: r['coord_cpu_ms_per_completion'], '.2f')} "
            f"| {_stat(runs, lambda r: 100 * r['coord_core_busy'], '.0f')}% "
            f"| {_stat(runs, lambda r: 100 * r['client_core_busy'], '.0f')}% "
            f"| {_stat(runs, lambda r: r['coord_rss_peak_mib'] * MIB_TO_MB, '.0f')} "
            f"| {_held(runs)} | {_stat(runs, lambda r: r['held']['max_renewed_gap_s'], '.2f')} "
            f"| {_stat(runs, lambda r: r['held']['false_suspicions'], '.0f')} "
            f"| {sum(r.get('finished', True) for r in runs)}/{len(runs)} "
            f"| {_stat(runs, lambda r: r['probe'].get('suspected_after_s'), '.2f')} "
            f"| {_stat(runs, lambda r: r['probe'].get('regranted_after_s'), '.2f')} |"
        )
    return rows


def run_table(result: dict[str, Any]) -> list[str]:
    rows = [
        "| daemons | run | trials ACKed | daemons granted | steady span (s) | completions/s | grants | NO_WORK "
        "| false suspicions | REJOINs | leases revoked (not the probe's) | REVOKED, lease no longer held | STALE / CONFLICT "
        "| leases fenced on a daemon | GRANTs refused as late | GRANTs after a crossing NO_WORK | READY / RESULT re-sends "
        "| messages the fakes could not place | finished | coordinator exit | store: attempts | holes "
        "| fsync p50 / p90 before (ms) "
        "| other processes' CPU before / during (cores) |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | --- "
        "| ---: | --- | ---: | --- | ---: | --- | --- |",
    ]
    for r in result["runs"]:
        h = r["held"]
        attempts = ", ".join(f"{k} {v}" for k, v in sorted(r["store"]["attempts"].items()))
        rows.append(
            f"| {r['n_daemons']} | {r['repeat']}{' (py-spy)' if r.get('profile') else ''} | {r['acked']} "
            f"| {r['daemons_granted']} | {_f(r['steady_s'], '.1f')} | {_f(r['completions_per_s'])} | {r['grants']} "
            f"| {r['no_work']} | {h['false_suspicions']} | {h['rejoins']} | {h['revoked_leases']} | {h['revoked_after_ack']} "
            f"| {h['stale']} / {h['conflict']} | {h['lapsed_leases']} | {h.get('late_grants', 0)} "
            f"| {h.get('grants_unmatched', 0)} "
            f"| {h.get('ready_resends', 0)} / {h.get('result_resends', 0)} | {r.get('n_unexpected', 0)} "
            f"| {'yes' if r.get('finished', True) else 'no (stopped)'} "
            f"| {r['coord_exit']} | {attempts} | {r['store']['holes']} "
            f"| {_f(r.get('fsync_ms_p50'), '.2f')} / {_f(r.get('fsync_ms_p90'), '.2f')} "
            f"| {_f(r.get('others_cores_at_start'), '.2f')} / {_f(r.get('others_cores_busy'), '.2f')} |"
        )
    return rows


def targets(result: dict[str, Any]) -> list[str]:
    sizes = by_size(result)
    settings = result["settings"]
    hb, ttl, grace = settings["heartbeat_s"], settings["ttl_s"], settings["grace_s"]
    rows = ["| target | measured | met |", "| --- | --- | --- |"]
    big = sizes.get(TARGET_DAEMONS)
    if big:
        rows.append(f"| {TARGET_DAEMONS:,} daemons held (all WELCOMEd, kept RENEWED, none suspected, no lease lost) "
                    f"| {_held(big)}; max gap between RENEWEDs {_stat(big, lambda r: r['held']['max_renewed_gap_s'], '.2f')} s "
                    f"| {'yes' if all(r['held']['all_held'] for r in big) else 'no'} |")
    rates = "; ".join(f"{n}: {_stat(runs, lambda r: r['completions_per_s'], '.0f')}" for n, runs in sorted(sizes.items()))
    best = max((common.median([r["completions_per_s"] for r in runs]) for runs in sizes.values()), default=math.nan)
    worst = min((common.median([r["completions_per_s"] for r in runs]) for runs in sizes.values()), default=math.nan)
    rows.append(f"| >= {TARGET_RATE:,.0f} trial completions/s | {rates} | "
                f"{'yes' if worst >= TARGET_RATE else 'no'} ({worst / TARGET_RATE:.0%} of it at worst, "
                f"{best / TARGET_RATE:.0%} at best) |")
    allruns = [r for runs in sizes.values() for r in runs if r["probe"].get("ran")]
    if allruns:
        sus = _stat(allruns, lambda r: r["probe"].get("suspected_after_s"), ".2f")
        strict = all(r["probe"]["suspect_met"] for r in allruns)
        lenient = all(r["probe"]["suspect_met_lenient"] for r in allruns)
        rows.append(f"| dead daemon suspected within 3 heartbeat intervals ({3 * hb:g} s) | {sus} s after its last "
                    f"message, all sizes | {'yes' if strict else 'no'} (from its last message); "
                    f"{'yes' if lenient else 'no'} counted from its first missed heartbeat |")
        reg = _stat(allruns, lambda r: r["probe"].get("regranted_after_s"), ".2f")
        strict = all(r["probe"]["regrant_met"] for r in allruns)
        lenient = all(r["probe"]["regrant_met_lenient"] for r in allruns)
        rows.append(f"| its lease re-granted within TTL + grace ({ttl + grace:g} s) | {reg} s after the GRANT it froze "
                    f"on (the lease's last renewal), to another FAKE daemon at attempt + 1 | {'yes' if strict else 'no'}; "
                    f"{'yes' if lenient else 'no'} allowing one heartbeat interval for an idle daemon's READY |")
    if big:
        rss = common.median([r["coord_rss_peak_mib"] * MIB_TO_MB for r in big])
        both = common.median([r.get("tree_hwm_bound_mib", math.nan) * MIB_TO_MB for r in big])
        rows.append(f"| coordinator RSS < {TARGET_RSS_MB:.0f} MB at {TARGET_DAEMONS:,} daemons "
                    f"| {_stat(big, lambda r: r['coord_rss_peak_mib'] * MIB_TO_MB, '.0f')} MB (VmHWM) for the main "
                    f"process; with its results.nc writer child(ren) "
                    f"{_stat(big, lambda r: r.get('tree_rss_peak_mib', math.nan) * MIB_TO_MB, '.0f')} MB read together, "
                    f"{_stat(big, lambda r: r.get('tree_hwm_bound_mib', math.nan) * MIB_TO_MB, '.0f')} MB adding the peaks "
                    f"| {'yes' if rss < TARGET_RSS_MB else 'no'} (main process); "
                    f"{'yes' if both < TARGET_RSS_MB else 'no'} (adding the writer's peak) |")
    return rows


def profile_rows(result: dict[str, Any]) -> list[str]:
    rows: list[str] = []
    for prof in (r for r in result["runs"] if r.get("pyspy")):
        p = prof["pyspy"]
        threads = ", ".join(f"{k} {v:.1f} s" for k, v in sorted(prof.get("coord_threads_cpu_s", {}).items(),
                                                               key=lambda kv: -kv[1])[:3])
        rows += [f"py-spy on the coordinator, {prof['n_daemons']} FAKE daemons: {p['samples']} samples at 100 Hz "
                 f"over {p.get('seconds', 40):.0f} s, idle included (py-spy stops the process for each sample: that "
                 f"run made {_f(prof['completions_per_s'])} completions/s). CPU by thread over the whole run: "
                 f"{threads or '-'}.", "",
                 "| part of the loop | share of wall time |", "| --- | ---: |"]
        rows += [f"| {name} | {share:.1%} |" for name, share in p["by_part"]]
        rows += ["", "| innermost line (self) | share |", "| --- | ---: |"]
        rows += [f"| `{frame}` | {share:.1%} |" for frame, share in p["top_self"][:12]]
        rows += ["", "| function (inclusive) | share |", "| --- | ---: |"]
        rows += [f"| `{frame}` | {share:.1%} |" for frame, share in p["top_inclusive"][:15]]
        rows.append("")
    return rows[:-1] if rows else rows


def table(result: dict[str, Any]) -> str:
    lines = ["", *size_table(result), "", *run_table(result), "", *targets(result)]
    prof = profile_rows(result)
    if prof:
        lines += ["", *prof]
    return "\n".join(lines)


def write_section(path: Path, result: dict[str, Any]) -> None:
    s = result["settings"]
    lines = [
        BEGIN,
        "## Coordinator at fleet scale: the real coordinator, FAKE daemons",
        "",
        f"Command (from the repository root): `.venv/bin/{result['command'].replace('python ', 'python ', 1)}`",
        "",
        f"Run on {result['started_utc']} (UTC), wall time {result['wall_s']:.0f} s.",
        "",
        *common.machine_table(result["machine"]),
        "",
        "### Method",
        "",
        "- Coordinator: the real CLI, `python -m coordinator sweep SPEC --results-root TMP --no-local-daemon "
        f"--bind tcp://127.0.0.1:PORT --heartbeat-interval {s['heartbeat_s']:g} --lease-ttl {s['ttl_s']:g} "
        f"--lease-grace {s['grace_s']:g} --daemon-wait 60`, pinned to its core; its real store: "
        "each loop pass makes all its results durable in one SQLite transaction (WAL, `synchronous=FULL`: one "
        "fsync) before it sends their ACKs; the per-attempt JSON files and the `results.nc` rewrites (at most "
        "every 2 s) are done by the coordinator's niced child process (`coordinator/dataset_writer.py`, on the "
        "coordinator's core, counted in its CPU), and the files it has not written by the end by the coordinator "
        "before it exits; a fresh results root per run.",
        "- Work: " + "; ".join(f"{n} daemons: {w}" for n, w in sorted({r["n_daemons"]: r["workload"]
                                                                         for r in result["runs"]}.items()))
        + "; the instant backend answers every trial at once, so the "
        "coordinator's own cost per result is what is measured.",
        f"- Daemons: FAKE ({s['client_procs']} process(es), one `zmq.Poller` loop each, one DEALER per daemon, "
        "`benchmarks/coordinator/clients.py`), pinned to the other core, speaking protocol 2 as `servetune/messages.py` "
        "states it: HELLO; READY (seq, answered_seq, held); on a GRANT (refused if it arrives after the READY it "
        "answers + TTL) one ok RESULT per trial (four fake samples) then READY; a HEARTBEAT every interval listing "
        "the leases held; leases fenced at their deadline; an unanswered READY or RESULT re-sent after 3 intervals "
        "(results backing off to 15 s, as `daemon/session.py`); REJOIN/NO_WORK/SHUTDOWN handled. Not mimicked: "
        "the real daemon's reconnect after 3 silent intervals.",
        "- Completions/s: ACKs per second between the 10th and 90th percentile ACK times seen by the fake "
        "daemons. Grant latency: the READY a GRANT answers (its seq) -> GRANT received. Heartbeat round trip: "
        "HEARTBEAT -> its RENEWED. CPU: `/proc` utime + stime over the same span, of the coordinator and its child processes. RSS peak: the coordinator's VmHWM; with its results.nc writer child(ren): their VmRSS read together every 0.1 s (peak of the sum), and the sum of their peaks (VmHWM; a bound whether or not the peaks coincided), in the targets table. "
        "fsync: 50 writes of a 3 KB file in the results root just before the run. Other processes: the machine's "
        "busy CPU (`/proc/stat`) minus the coordinator's and the fleet's, in cores (the benchmark's own script, "
        "which tails the coordinator's log on the client core, counts here).",
        f"- Dead-daemon probe, in every run but the profiled ones: {s['probe_after_s']:g} s after the fleet starts, "
        "the next daemon granted a batch freezes (sends nothing more, reads nothing) while holding its lease. "
        "Suspected: the coordinator's last `daemon X suspected` log line about it minus the frozen daemon's last "
        "message. Re-granted: another fake daemon receives its trials at attempt + 1, minus the GRANT it froze on "
        "(the lease's last renewal).",
        "- Before each run the benchmark waits (up to `--quiet-wait-s`) until other processes use under 15% of "
        "the cores; the machine is shared, so the 'other processes' column says how quiet each run was.",
        "",
        "### Per fleet size (medians, range over runs in brackets)",
        "",
        *size_table(result),
        "",
        "### Targets",
        "",
        *targets(result),
        "",
        "### Every run",
        "",
        *run_table(result),
    ]
    prof = profile_rows(result)
    if prof:
        lines += ["", "### Where the coordinator's time goes", "", *prof]
    lines += ["", END, ""]
    common.replace_section(path, "\n".join(lines), BEGIN, END)
