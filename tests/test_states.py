"""Attempt states move running -> ok | failed exactly once; anything else is refused."""

from __future__ import annotations

import itertools

import pytest

from servetune.states import ATTEMPT_TRANSITIONS, AttemptStatus, StateError, check_attempt


@pytest.mark.parametrize("cur,new", list(itertools.product(list(AttemptStatus), repeat=2)))
def test_every_attempt_transition_is_judged_by_the_table(cur: AttemptStatus, new: AttemptStatus) -> None:
    for a, b in ((cur, new), (cur.value, new.value), (cur.value, new), (cur, new.value)):
        if new in ATTEMPT_TRANSITIONS[cur]:
            got = check_attempt(a, b)
            assert got is new and isinstance(got, AttemptStatus)
        else:
            with pytest.raises(StateError, match=f"from {cur.value} to {new.value}"):
                check_attempt(a, b)


def test_only_running_attempts_finish() -> None:
    assert {(c, n) for c in AttemptStatus for n in ATTEMPT_TRANSITIONS[c]} == {
        (AttemptStatus.RUNNING, AttemptStatus.OK), (AttemptStatus.RUNNING, AttemptStatus.FAILED)}
    with pytest.raises(ValueError):
        check_attempt("running", "lost")
