"""The load-generator section of ``benchmarks/RESULTS.md``: tables from one run, targets judged.

The section sits between :data:`BEGIN` and :data:`END` markers; a new run replaces it and leaves
the rest of RESULTS.md (other benchmarks) alone. Where a rate was repeated, every figure is the
median over its repeats.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import machine_table, median, replace_section
from benchmarks.loadgen.clients import ToolRun
from benchmarks.loadgen.points import SUSTAINED_RATIO, Point, highest_sustained
from benchmarks.loadgen.spy import SAMPLE_HZ, Profile
from benchmarks.loadgen.timing import MAX_SEND_TO_RECV_MS, Accuracy

BEGIN = "<!-- loadgen:begin (written by `python -m benchmarks.loadgen`; edits inside are overwritten) -->"
END = "<!-- loadgen:end -->"

OURS = "servetune"


@dataclass
class Row:
    """One client at one offered rate, medians over its repeats."""

    client: str
    offered: float
    runs: int
    achieved: float
    ratio: float
    n_ok: int
    n_errors: int
    ttft_p50: float
    ttft_mean: float
    ttft_p99: float
    cpu_per_1k: float | None
    core_busy: float | None  # client CPU-s / window s: 1.0 = its core fully used

    @property
    def sustained(self) -> bool:
        return self.ratio >= SUSTAINED_RATIO


def _med(xs: Sequence[float | None]) -> float | None:
    vals = [x for x in xs if x is not None and not math.isnan(x)]
    return median(vals) if vals else None


def rows_of(run: ToolRun) -> list[Row]:
    groups: dict[float, list[Point]] = {}
    for p in run.points:
        groups.setdefault(p.offered, []).append(p)
    rows = []
    for offered, ps in sorted(groups.items()):
        rows.append(
            Row(
                client=run.client,
                offered=offered,
                runs=len(ps),
                achieved=median([p.achieved for p in ps]),
                ratio=median([p.ratio for p in ps]),
                n_ok=round(median([p.n_ok for p in ps])),
                n_errors=round(median([p.n_errors for p in ps])),
                ttft_p50=_med([p.ttft_ms["p50"] for p in ps]) or math.nan,
                ttft_mean=_med([p.ttft_ms["mean"] for p in ps]) or math.nan,
                ttft_p99=_med([p.ttft_ms["p99"] for p in ps]) or math.nan,
                cpu_per_1k=_med([p.cpu_per_1k for p in ps]),
                core_busy=_med([p.cpu_s / p.window_s if p.cpu_s is not None and p.window_s > 0 else None for p in ps]),
            )
        )
    return rows


#: How far TTFT (p50 and mean) may rise above the lowest rate's for a rate to count as clean (ms).
TTFT_SLACK_MS = 1.0


@dataclass
class Summary:
    """One client's ladder in a few rows.

    ``sustained``: its highest sustained rate; ``low``: its lowest rate; ``clean``: the highest
    sustained rate whose TTFT p50 and mean are both within :data:`TTFT_SLACK_MS` of the lowest
    rate's; ``first_missed``: the lowest unsustained rate.
    """

    client: str
    sustained: Row | None
    low: Row | None
    clean: Row | None
    first_missed: Row | None
    process_cpu_s: float
    wall_s: float


def _within(row: Row, low: Row) -> bool:
    return row.ttft_p50 - low.ttft_p50 <= TTFT_SLACK_MS and row.ttft_mean - low.ttft_mean <= TTFT_SLACK_MS


def summarize_run(run: ToolRun) -> Summary:
    rows = rows_of(run)
    best = highest_sustained([(r.offered, r.ratio) for r in rows])
    sustained = next((r for r in rows if r.offered == best), None)
    first_missed = next((r for r in rows if not r.sustained), None)
    low = rows[0] if rows else None
    ok = [r for r in rows if best is not None and r.offered <= best]
    clean = next((r for r in reversed(ok) if low is not None and _within(r, low)), None)
    return Summary(run.client, sustained, low, clean, first_missed, run.process_cpu_s, run.wall_s)


def _f(x: float | None, fmt: str = ".3f") -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def _summary_table(sums: list[Summary]) -> list[str]:
    out = [
        "| client | highest sustained rate (req/s) | client CPU-s per 1,000 requests there "
        "| TTFT p50 / mean / p99 at lowest rate (ms) | TTFT p50 / mean / p99 there (ms) "
        "| highest sustained rate with TTFT p50 and mean within 1 ms of the lowest rate's (req/s) "
        "| first rate missed: achieved (req/s), client core busy |",
        "| --- | ---: | ---: | --- | --- | ---: | --- |",
    ]
    for s in sums:
        at, low, clean = s.sustained, s.low, s.clean
        missed = (
            f"{s.first_missed.offered:g}: {s.first_missed.achieved:.1f}, {_f(s.first_missed.core_busy, '.0%')}"
            if s.first_missed
            else "none in the ladder"
        )
        if at is None or low is None:
            out.append(f"| {s.client} | none (even the lowest rate missed) | | | | | {missed} |")
            continue
        out.append(
            f"| {s.client} | {at.offered:g} | {_f(at.cpu_per_1k)} "
            f"| {_f(low.ttft_p50)} / {_f(low.ttft_mean)} / {_f(low.ttft_p99)} "
            f"| {_f(at.ttft_p50)} / {_f(at.ttft_mean)} / {_f(at.ttft_p99)} "
            f"| {clean.offered if clean else 0:g} | {missed} |"
        )
    return out


def _detail_table(runs: list[ToolRun]) -> list[str]:
    out = [
        "| offered (req/s) | client | runs | achieved (req/s) | achieved/offered | completed | not completed "
        "| TTFT p50 / mean / p99 (ms) | client CPU-s per 1,000 req | client core busy |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: |",
    ]
    rows = sorted((r for run in runs for r in rows_of(run)), key=lambda r: (r.offered, r.client))
    for r in rows:
        mark = "" if r.sustained else " (missed)"
        out.append(
            f"| {r.offered:g} | {r.client} | {r.runs} | {r.achieved:.1f} | {r.ratio:.4f}{mark} | {r.n_ok} | {r.n_errors} "
            f"| {_f(r.ttft_p50)} / {_f(r.ttft_mean)} / {_f(r.ttft_p99)} | {_f(r.cpu_per_1k)} | {_f(r.core_busy, '.0%')} |"
        )
    return out


def _accuracy_table(acc: list[Accuracy]) -> list[str]:
    out = [
        "| client | offered (req/s), Poisson | matched requests | target's TTFT p50 (ms) | client's TTFT p50 (ms) "
        "| error p50 / p99 / max (ms) | send -> target receive p50 / p99 (ms) "
        "| target first byte -> client's first token p50 / p99 (ms) |",
        "| --- | ---: | ---: | ---: | ---: | --- | --- | --- |",
    ]
    for a in acc:
        out.append(
            f"| {a.client} | {a.rate:g} | {a.n} | {_f(a.target_ttft_p50_ms)} | {_f(a.client_ttft_p50_ms)} "
            f"| {_f(a.error_ms['p50'])} / {_f(a.error_ms['p99'])} / {_f(a.error_ms['max'])} "
            f"| {_f(a.send_to_recv_ms['p50'])} / {_f(a.send_to_recv_ms['p99'])} "
            f"| {_f(a.byte_to_token_ms['p50'])} / {_f(a.byte_to_token_ms['p99'])} |"
        )
    notes = [f"- {a.client}, {a.rate:g} req/s: {n}" for a in acc for n in a.notes]
    notes += [
        f"- {a.client}, {a.rate:g} req/s: {a.mismatched} of the pairs not matched (send to receive over {MAX_SEND_TO_RECV_MS:g} ms)"
        for a in acc
        if a.mismatched
    ]
    return out + ([""] + notes if notes else [])


def _best_peer(peers: list[Summary], pick: str) -> tuple[str, float]:
    def rate(s: Summary) -> float:
        row = getattr(s, pick)
        return float(row.offered) if row is not None else 0.0

    best = max(peers, key=rate)
    return best.client, rate(best)


def targets(sums: list[Summary], acc: list[Accuracy]) -> list[tuple[str, str, bool | None]]:
    """(target, measured, met) for each target of the issue."""
    ours = next((s for s in sums if s.client == OURS), None)
    peers = [s for s in sums if s.client != OURS]
    out: list[tuple[str, str, bool | None]] = []
    if ours is not None and peers:
        for pick, what in (
            ("sustained", "our sustained rate >= 2x the better peer's"),
            ("clean", "the same, counting only rates whose TTFT p50 and mean stay within 1 ms of the lowest rate's"),
        ):
            row = getattr(ours, pick)
            ours_rate = float(row.offered) if row is not None else 0.0
            peer, peer_rate = _best_peer(peers, pick)
            ratio = ours_rate / peer_rate if peer_rate else math.inf
            measured = f"{ours_rate:g} vs {peer_rate:g} req/s ({peer}): {ratio:.2f}x"
            if pick == "sustained" and ours.first_missed is None:
                measured += " (our ladder ended without a miss: our limit is higher)"
            out.append((what, measured, ratio >= 2))
    if ours is not None and ours.sustained and ours.low:
        d50 = ours.sustained.ttft_p50 - ours.low.ttft_p50
        dmean = ours.sustained.ttft_mean - ours.low.ttft_mean
        dp99 = ours.sustained.ttft_p99 - ours.low.ttft_p99
        out.append(
            (
                f"our TTFT at {ours.sustained.offered:g} req/s within 1 ms of our TTFT at {ours.low.offered:g} req/s",
                f"p50 {d50:+.3f} ms, mean {dmean:+.3f} ms (p99 {dp99:+.3f} ms)",
                d50 <= TTFT_SLACK_MS and dmean <= TTFT_SLACK_MS,
            )
        )
    ours100 = next((a for a in acc if a.rate == 100 and a.client == OURS), None)
    floor100 = next((a for a in acc if a.rate == 100 and a.client != OURS), None)
    if ours100 is not None:
        measured = f"{ours100.error_ms['p99']:.3f} ms"
        if floor100 is not None:
            measured += f" (raw-socket floor on this machine: {floor100.error_ms['p99']:.3f} ms)"
        out.append(("timing error p99 < 1 ms at 100 req/s", measured, ours100.error_ms["p99"] < 1))
    return out


def bound_of(s: Summary, prof: Profile | None) -> str:
    """What limits a client, in measured figures (its first missed rate and its core's load there)."""
    m = s.first_missed
    if m is None:
        top = s.sustained.offered if s.sustained else 0.0
        return f"not reached in this ladder: every rate up to {top:g} req/s was sustained"
    text = f"at {m.offered:g} req/s offered it completed {m.achieved:.1f} req/s with its core {_f(m.core_busy, '.0%')} busy"
    if m.cpu_per_1k:
        text += f", spending {m.cpu_per_1k:.3f} CPU-s per 1,000 requests there"
    if s.sustained is not None and s.sustained.cpu_per_1k:
        at = s.sustained
        text += (
            f" ({at.cpu_per_1k:.3f} at {at.offered:g} req/s, its highest sustained rate, where its core was "
            f"{_f(at.core_busy, '.0%')} busy)"
        )
    busy = m.core_busy if m.core_busy is not None else 0.0
    label = "CPU-bound" if busy >= 0.9 else "close to CPU-bound" if busy >= 0.75 else "not CPU-saturated"
    text = f"{label}: {text}"
    if s.client == OURS and prof is not None:
        shares = ", ".join(f"{lib} {share:.0%}" for lib, share in prof.by_library[:6])
        text += f". Where its CPU goes at {prof.rate:g} req/s (py-spy): {shares}; see the profile below"
    return text


def _profile_lines(prof: Profile) -> list[str]:
    out = [
        f"py-spy ({SAMPLE_HZ} samples/s, non-blocking) on our driver at {prof.rate:g} req/s offered, its highest "
        f"sustained rate (it achieved {prof.achieved:.1f} req/s while sampled). {prof.samples_loop} of "
        f"{prof.samples_total} samples were event-loop work (start-up and the conversion of records into "
        "samples excluded); each is charged to its innermost Python frame (a native call such as `socket.send` "
        "to the Python function that made it).",
        "",
        "| share of samples | library |",
        "| ---: | --- |",
    ]
    out += [f"| {share:.1%} | {lib} |" for lib, share in prof.by_library]
    out += ["", "| share of samples | innermost frame |", "| ---: | --- |"]
    out += [f"| {share:.1%} | `{frame}` |" for frame, share in prof.top]
    return out


def render(
    meta: dict[str, Any],
    runs: list[ToolRun],
    acc: list[Accuracy],
    prof: Profile | None,
) -> str:
    sums = [summarize_run(r) for r in runs]
    bounds = {s.client: bound_of(s, prof) for s in sums}
    lines = [
        BEGIN,
        "## Load generator: servetune vs `vllm bench serve` vs GuideLLM",
        "",
        f"Command (from the repository root): `{meta['command']}`",
        "",
        f"Run on {meta['date']} (UTC), wall time {meta['wall_s']:.0f} s.",
        "",
        *machine_table(meta["machine"]),
    ]
    lines += [
        "",
        "### Method",
        "",
        *meta["method"],
        "",
        "### Summary",
        "",
        *_summary_table(sums),
        "",
        "What bounds each client:",
        "",
        *[f"- **{k}**: {v}" for k, v in bounds.items()],
        "",
        "### Targets (issue 3)",
        "",
        "| target | measured | met |",
        "| --- | --- | --- |",
    ]
    lines += [
        f"| {t} | {m} | {'yes' if ok else 'no' if ok is not None else 'n/a'} |" for t, m, ok in targets(sums, acc)
    ]
    lines += ["", "### Every point", "", *_detail_table(runs), ""]
    lines += [f"- {r.client}: whole-run client CPU {r.process_cpu_s:.1f} s (start-up included), wall {r.wall_s:.0f} s, "
              f"1-min load average {r.loadavg[0]:.2f} before, {r.loadavg[1]:.2f} after" for r in runs]  # fmt: skip
    if acc:
        lines += ["", "### Timing accuracy of our client", "", *meta["accuracy_method"], "", *_accuracy_table(acc)]
    if prof is not None:
        lines += ["", "### Profile of our client", "", *_profile_lines(prof)]
    lines += ["", END]
    return "\n".join(lines) + "\n"


def update_results(path: Path, section: str) -> None:
    """Replace the loadgen section of ``path`` (or append it; create the file if missing)."""
    replace_section(path, section, BEGIN, END, blank_line_after=False)
