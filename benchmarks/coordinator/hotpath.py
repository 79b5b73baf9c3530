"""Micro-benchmark of the coordinator's per-RESULT work outside the control core, in one process:
decode the FAKE daemons' RESULT frame, the plausibility check, the summary (``summary_dict``, as
``SweepRunner._metrics``), the record's JSON,
``Store.finish_attempt`` inside a group (one COMMIT per 64 results, as a busy loop pass), the ACK's
encode. CPU time (``time.process_time``) per result, best of ``--repeats``; a FAKE outcome (four
requests, ``benchmarks.coordinator.clients.fake_outcome``). Run: ``python -m benchmarks.coordinator.hotpath``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from benchmarks.coordinator.clients import fake_fingerprint, fake_outcome
from coordinator.store import Store
from servetune.manifest import plan_grid
from servetune.messages import Ack, Result, decode, encode
from servetune.metrics import server_summary, summary_dict
from servetune.plausibility import implausible
from servetune.spec import parse_spec

SPEC = """
name: hotpath
engine: {grid: {max_num_seqs: [%s]}, fixed: {max_model_len: 256}}
load_points:
  - {name: a, request_rate: 4, num_requests: 4, input_len: 128, output_len: 4}
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.coordinator.hotpath", description=__doc__)
    ap.add_argument("--n", type=int, default=1000, help="results per repeat (default: %(default)s)")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    outcome = fake_outcome(fake_fingerprint())
    best: dict[str, float] = {}
    for _rep in range(args.repeats):
        with tempfile.TemporaryDirectory() as tmp:
            spec = parse_spec(SPEC % ", ".join(str(i + 1) for i in range(args.n)))
            plan = plan_grid(spec)
            store = Store.open(Path(tmp) / "exp")
            store.record_plan(spec.spec_hash(), spec.model_dump(mode="json"), None, plan)
            store.defer_result_files = True
            trials = list(plan.trials())
            for m in trials:
                store.begin_attempt(m.trial_id, daemon_id="d", batch_id="b", spec_hash="h")
            frames = [encode(Result(session_nonce="s", batch_id="b", trial_id=m.trial_id, epoch=1,
                                    submission_id=f"sub{i}", outcome=outcome)) for i, m in enumerate(trials)]
            t: dict[str, float] = dict.fromkeys(("decode", "plausible", "summarize", "record", "store", "ack"), 0.0)
            clock = time.process_time
            for i0 in range(0, len(frames), 64):
                with store.group():
                    for frame, m in zip(frames[i0:i0 + 64], trials[i0:i0 + 64]):
                        a = clock()
                        msg = decode(frame)
                        b = clock()
                        assert isinstance(msg, Result)
                        o = msg.outcome
                        implausible(o)
                        c = clock()
                        metrics = {**summary_dict(o.samples, o.window_s, (), offered_rate=o.offered_rate),
                                   **server_summary(o.server_series, o.server_counters)}
                        d = clock()
                        metrics_json = json.dumps(metrics)
                        record = (f'{{"trial_id": "{msg.trial_id}", "metrics": {metrics_json}, '
                                  f'"manifest": {m.model_dump_json()}, "outcome": {o.model_dump_json()}}}')
                        e = clock()
                        store.finish_attempt(msg.trial_id, 1, status="ok", failure_kind=None, error=None,
                                             submission_id=msg.submission_id, record=record, metrics=metrics_json,
                                             hardware_class=None)
                        f = clock()
                        encode(Ack(trial_id=msg.trial_id, submission_id=msg.submission_id))
                        g = clock()
                        for k, v in zip(t, (b - a, c - b, d - c, e - d, f - e, g - f)):
                            t[k] += v
            store.write_result_files()
            store.close()
        for k, v in t.items():
            best[k] = min(best.get(k, float("inf")), v * 1000 / len(frames))
    print(" ".join(f"{k} {v:.3f}" for k, v in best.items()), f"| sum {sum(best.values()):.3f} CPU-ms per result")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
