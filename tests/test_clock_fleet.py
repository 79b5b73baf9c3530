"""Clock offsets end to end on loopback: real coordinator and daemon processes (tests/clock_fleet.py),
one daemon with a TEST-ONLY planted offset of +2.5 s, two without (one machine: they must agree)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.clock_fleet import run_clock_fleet
from tests.fakes.openai_server import FakeOpenAIServer

pytestmark = pytest.mark.timeout(180)


def test_a_planted_offset_is_reported_within_its_uncertainty_and_daemons_on_one_machine_agree(tmp_path: Path) -> None:
    with FakeOpenAIServer(token_delay_ms=5.0, ttft_ms=5.0) as server:
        run = run_clock_fleet(tmp_path, server.base_url, {"skewed": 2.5, "plain-a": 0.0, "plain-b": 0.0})
    assert run.exit_code == 0, run.log[-4000:]
    assert set(run.offsets) == {"skewed", "plain-a", "plain-b"}, run.log[-4000:]
    skewed = run.offsets["skewed"]
    assert abs(skewed["offset_s"] - 2.5) <= skewed["uncertainty_s"], skewed
    assert skewed["uncertainty_s"] < 0.5 and not skewed["agrees"], skewed
    assert skewed["probes_answered"] >= 1 and skewed["rtt_s"] >= 2 * skewed["uncertainty_s"]
    for name in ("plain-a", "plain-b"):
        assert run.offsets[name]["agrees"], run.offsets[name]
        assert abs(run.offsets[name]["offset_s"]) <= run.offsets[name]["uncertainty_s"]
    assert "clock: daemon skewed offset +2.5" in run.log
    assert "clock: daemon plain-a agrees within ±" in run.log
    assert "clock: daemon plain-b agrees within ±" in run.log
