"""The mutation list stays true to the code it breaks (``benchmarks/mutations.py``): every
entry's pattern occurs exactly once, the tests it names exist, and the report names the tests that
killed a mutant."""

from __future__ import annotations

from pathlib import Path

from benchmarks.mutations import MUTATIONS, failed_tests

REPO = Path(__file__).resolve().parents[1]


def test_every_mutation_applies_once_and_names_existing_tests() -> None:
    """Every entry, not only the analysis ones: a pattern that no longer matches would be reported
    as not checked by the script, so the promise it guards would go unchecked until someone ran it."""
    assert len([m for m in MUTATIONS if m.path.startswith("analysis/")]) >= 10
    for m in MUTATIONS:
        assert (REPO / m.path).read_text(encoding="utf-8").count(m.pattern) == 1, m.id
        assert m.pattern != m.replacement, m.id
    for m in MUTATIONS:
        for t in m.tests:
            assert (REPO / t.split("::")[0]).is_file(), (m.id, t)
    assert len({m.id for m in MUTATIONS}) == len(MUTATIONS)


def test_the_report_names_the_failing_tests() -> None:
    out = ("....F\n=== short test summary info ===\n"
           "FAILED tests/test_a.py::test_x[1] - AssertionError: assert 0.83 == 1.0\n"
           "ERROR tests/test_b.py::test_y\n!!! stopping after 1 failures !!!\n1 failed, 4 passed in 2.0s\n")
    assert failed_tests(out) == ("tests/test_a.py::test_x[1]", "tests/test_b.py::test_y")
    assert failed_tests("5 passed in 1.0s") == ()
    assert failed_tests("FAILED tests/test_a.py::test_x | !!! stopping | 1 failed\nFAILED tests/test_a.py::test_x\n") \
        == ("tests/test_a.py::test_x",)
