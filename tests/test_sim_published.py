"""benchmarks.sim.published: the transcribed published figures add up, and every row says SIMULATED and uncalibrated."""

from __future__ import annotations

import dataclasses

import pytest

from benchmarks.sim.published import FIGURES, check, main


def test_the_transcribed_lengths_add_up_to_the_published_totals() -> None:
    for fig in FIGURES:
        check(fig)
    wrong = dataclasses.replace(FIGURES[2], output_lens=[*FIGURES[2].output_lens[:-1], FIGURES[2].output_lens[-1] + 1])
    with pytest.raises(ValueError, match="lengths sum to"):
        check(wrong)


def test_every_row_is_labelled_simulated_and_every_profile_uncalibrated(capsys: pytest.CaptureFixture[str]) -> None:
    main()
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| [")]
    assert len(rows) == 3 * len(FIGURES)
    assert all("SIMULATED" in row for row in rows)
    sources = [line for line in out.splitlines() if line.startswith("- [")]
    assert len(sources) == len(FIGURES)
    assert all("uncalibrated (from published specs)" in line and "github.com/LambdaLabsML" in line for line in sources)
