"""Sweep progress off a terminal: a line per change, at most ten a second for finished trials."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from coordinator import progress as progress_mod
from coordinator.progress import SweepProgress


def _lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("[")]


def test_ok_trials_are_coalesced_but_failures_and_the_last_trial_get_their_line(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [100.0]
    monkeypatch.setattr(progress_mod.time, "monotonic", lambda: clock[0])
    with SweepProgress(300, 10.0, Console(file=io.StringIO(), force_terminal=False)) as p:
        for i in range(300):
            clock[0] += 0.001  # a thousand trials a second
            if i == 150:
                p.trial_done(False, f"t{i}: FAILED (measurement): boom")
            else:
                p.trial_done(True, f"t{i}: ok")
    lines = _lines(capsys.readouterr().err)
    assert any("t150: FAILED" in line for line in lines)
    assert lines[-1].startswith("[300/300] t299: ok")
    assert lines[0].startswith("[1/300] t0: ok")
    # 0.3 s of trials: about one line per 0.1 s, plus the failure and the last one
    assert 4 <= len(lines) <= 7, lines


def test_slow_trials_each_get_a_line(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [100.0]
    monkeypatch.setattr(progress_mod.time, "monotonic", lambda: clock[0])
    with SweepProgress(5, 10.0, Console(file=io.StringIO(), force_terminal=False)) as p:
        for i in range(5):
            clock[0] += 30.0  # a real server start and load point each
            p.trial_done(True, f"t{i}: ok")
    lines = _lines(capsys.readouterr().err)
    assert [line.split()[0] for line in lines] == [f"[{i}/5]" for i in range(1, 6)]


def test_the_first_eta_is_the_backend_s_own() -> None:
    from servetune.manifest import plan_grid
    from servetune.spec import parse_spec

    plan = plan_grid(parse_spec("""
name: eta
engine: {grid: {max_num_seqs: [4, 8]}}
load_points: [{name: a, max_concurrency: 1, num_requests: 4, input_len: 8, output_len: 8}]
"""))
    assert plan.wall_estimate_seconds("sim") is None
    real, endpoint = plan.wall_estimate_seconds("vllm"), plan.wall_estimate_seconds("openai")
    assert real is not None and endpoint is not None and real - endpoint == 2 * 50.0
    assert SweepProgress(2, None, Console(file=io.StringIO())).eta() is None
    eta = SweepProgress(2, 120.0, Console(file=io.StringIO())).eta()
    assert eta is not None and 119.0 < eta <= 120.0
