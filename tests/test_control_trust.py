"""The control core's trust rules, pure, with the fake clock of tests/test_control.py: a session is
bound to the CURVE key it was opened with, and revoking a key fences that key's leases."""

from __future__ import annotations

from dataclasses import replace

from coordinator.control import Accept, BeginAttempts, CloseAttempts, ControlCore, DaemonLeft, Refused, orphans_from
from servetune.keys import key_id
from servetune.messages import Ack, Grant, Heartbeat, Ready, Renewed, Result, Stale, Welcome
from servetune.result import TrialOutcome
from tests.test_control import Clock, core, hello, refs, result, sent, work

KEY_A = "A" * 40
KEY_B = "B" * 40


def join(c: ControlCore, d: str, nonce: str, key: str) -> Grant:
    assert sent(c.handle(d, hello(d, nonce), key), Welcome)
    out = c.handle(d, Ready(session_nonce=nonce), key)
    assert [i for i in out if isinstance(i, BeginAttempts)]
    return sent(out, Grant)[0]  # type: ignore[return-value]


def test_a_session_answers_only_to_the_key_it_was_opened_with() -> None:
    clock = Clock()
    c = core(clock)
    g = join(c, "d1", "n1", KEY_A)
    assert c.key_of("d1") == KEY_A
    # another admitted key on the same routing id, even knowing the session nonce: refused, no effect
    for msg in (hello("d1", "n2"), hello("d1", "n1"), result("n1", g, 0, "forged"),
                Heartbeat(session_nonce="n1", seq=1, leases=refs(g)), Ready(session_nonce="n1")):
        out = c.handle("d1", msg, KEY_B)
        assert len(out) == 1 and isinstance(out[0], Refused), out
        assert out[0].key == KEY_B and "another key" in out[0].reason
    assert len(c.leases) == 1 and c.key_of("d1") == KEY_A
    # the real daemon's result still counts
    out = c.handle("d1", result("n1", g, 0, "real"), KEY_A)
    assert [type(i) for i in out] == [Accept, type(out[1])] and sent(out, Ack)


def test_revoking_a_key_forgets_its_sessions_and_fences_their_leases() -> None:
    clock = Clock()
    c = core(clock)
    g = join(c, "d1", "n1", KEY_A)
    join(c, "d2", "n2", KEY_B)
    out = c.revoke_key(KEY_A, "key removed from the allow-list")
    closed = [i for i in out if isinstance(i, CloseAttempts)]
    assert closed and sorted(closed[0].pairs) == sorted((t.trial_id, t.attempt) for t in g.trials)
    assert "key removed from the allow-list" in closed[0].reason
    assert [i.daemon_id for i in out if isinstance(i, DaemonLeft)] == ["d1"]
    assert "d1" not in c.daemons and "d2" in c.daemons
    # the fenced trials are queued again, first in line, for another daemon
    assert {m.trial_id for m in c.queue[0].trials} == {t.trial_id for t in g.trials}
    # a late result of the revoked session is not accepted
    assert not [i for i in c.handle("d1", result("n1", g, 0, "late"), KEY_A) if isinstance(i, Accept)]
    assert c.revoke_key(KEY_A, "again") == []


def test_an_orphaned_lease_is_adopted_only_by_the_key_it_was_granted_to() -> None:
    w = work()
    first = w[0]
    orphans, rest, _ = orphans_from([(m.trial_id, 1, "d1", first.batch_id) for m in first.trials], w)
    orphans = [replace(o, key_id=key_id(KEY_A)) for o in orphans]
    held = [(m.trial_id, 1) for m in first.trials]
    res = Result(session_nonce="nb", batch_id=first.batch_id, trial_id=first.trials[0].trial_id, epoch=1,
                 submission_id="forged", outcome=TrialOutcome(status="ok", started_at_us=1, finished_at_us=2))
    # after a coordinator restart another admitted key says HELLO on d1's routing id first
    clock = Clock()
    c = core(clock, work=rest, orphans=orphans, attempts={m.trial_id: 1 for m in first.trials})
    out = c.handle("d1", hello("d1", "nb", held=held), KEY_B)
    assert not sent(out, Renewed) and not [i for i in out if isinstance(i, CloseAttempts)]
    assert any("cannot adopt orphaned lease" in getattr(i, "text", "") for i in out)
    out = c.handle("d1", res, KEY_B)
    assert sent(out, Stale) and not [i for i in out if isinstance(i, Accept)]
    # the key it was granted to adopts it
    c2 = core(Clock(), work=rest, orphans=orphans, attempts={m.trial_id: 1 for m in first.trials})
    assert len(sent(c2.handle("d1", hello("d1", "na", held=held), KEY_A), Renewed)[0].leases) == 2  # type: ignore[attr-defined]
    assert [i for i in c2.handle("d1", res.model_copy(update={"session_nonce": "na"}), KEY_A) if isinstance(i, Accept)]
