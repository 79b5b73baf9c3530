"""Resource groups end to end: a real coordinator and two real daemons on loopback measuring one
FAKE ``openai`` endpoint (tests/fakes/openai_server.py) that the fleet file declares a shared
group. The endpoint's own request log (each daemon sends its own API key, so the endpoint can tell
them apart) must show their measurement windows never overlap, and both daemons measure (turns).

The fake listens on 127.0.0.1, which the policy takes for each node's own server, so the group is
declared explicitly here; a non-loopback ``base_url`` is such a group without any declaration
(tests/test_policy.py). ``benchmarks/fleet_overlap.py`` counts the overlap with and without it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes.openai_server import FakeOpenAIServer
from tests.fleet_harness import Fleet, activity_windows, check_invariants, window_overlaps

pytestmark = pytest.mark.timeout(180)

FLEET_FILE = "groups:\n  - {name: shared-endpoint, daemons: [d1, d2]}\n"


@pytest.fixture
def endpoint() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(token_delay_ms=2.0, ttft_ms=5.0) as server:
        yield server


def run_shared_fleet(tmp: Path, server: FakeOpenAIServer, fleet_file: str | None, repeats: int = 4,
                     requests: int = 20) -> tuple[Fleet, str]:
    """Sweep with two daemons, d1 and d2, each sending its own API key to ``server``; returns the
    fleet (closed) and the coordinator's log. ``fleet_file``: its text, or None for none."""
    fleet = Fleet(tmp, server.base_url, repeats=repeats, requests=requests, backend=", api_key_env: FLEET_KEY")
    extra: list[str] = []
    if fleet_file is not None:
        path = tmp / "fleet-settings.yaml"  # (the spec is fleet.yaml)
        path.write_text(fleet_file)
        extra = ["--fleet", str(path)]
    try:
        fleet.start_coordinator(*extra)
        for d in ("d1", "d2"):
            fleet.start_daemon(d, None, "--api-key-env", "FLEET_KEY", env={"FLEET_KEY": f"key-{d}"})
        code, _, log = fleet.wait_coordinator(150)
        assert code == 0, f"exit {code}:\n{log[-4000:]}"
        for proc in fleet.daemons.values():
            proc.wait(timeout=15)
    finally:
        left = fleet.close()
    assert not left, f"processes left behind: {left}"
    return fleet, log


def test_two_daemons_on_one_declared_shared_endpoint_never_overlap_their_windows(
        tmp_path: Path, endpoint: FakeOpenAIServer) -> None:
    fleet, log = run_shared_fleet(tmp_path, endpoint, FLEET_FILE)
    requests = list(endpoint.fake.request_log)
    assert {r.client for r in requests} == {"key-d1", "key-d2"}, "both daemons measured, each under its own key"
    assert all(r.status == 200 for r in requests)
    assert window_overlaps(requests) == (0, 0.0), activity_windows(requests)
    assert "resource group shared-endpoint" in log
    assert not check_invariants(fleet)
    by_daemon = fleet.query("SELECT daemon_id, COUNT(*) FROM attempts WHERE status='ok' GROUP BY daemon_id")
    assert dict(by_daemon).keys() == {"d1", "d2"} and sum(n for _, n in by_daemon) == 8
