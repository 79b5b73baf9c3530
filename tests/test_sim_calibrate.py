"""The sim calibration fit (benchmarks.sim_calibrate) recovers overheads planted in data the simulator made."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from benchmarks import sim_calibrate as calibrate
from benchmarks.sim_calibrate import PARAMS, Run, fit, load_runs, predict, with_params
from servetune.sim.profiles import CALIBRATION_ENV, get_profile

PLANTED = (3.0e-3, 0.8e-3, 0.04e-3)


def _runs() -> list[Run]:
    """Four of the stored real runs' configs and load points, shortened (fewer requests)."""
    runs = load_runs(calibrate.DEFAULT_RUNS)
    picked = [runs[i] for i in (0, 1, 2, 3)]
    return [Run(engine=r.engine, load_point={**r.load_point, "num_requests": 20, "warmup_requests": 2},
                observed=r.observed) for r in picked]


def test_the_fit_recovers_planted_overheads_from_simulated_data() -> None:
    base = get_profile("cpu-tiny", calibrated=False)
    truth = with_params(base, PLANTED)
    runs = [Run(engine=r.engine, load_point=r.load_point, observed=predict(r, truth)) for r in _runs()]
    theta = fit(runs, base)  # starts from the profile's defaults, far from the planted values
    assert np.allclose(theta, PLANTED, rtol=0.1), dict(zip(PARAMS, theta, strict=True))


def test_the_simulator_uses_a_calibration_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "cal.json"
    path.write_text(json.dumps({"cpu-tiny": {"fitted": dict(zip(PARAMS, PLANTED, strict=True)),
                                             "calibration": "fitted to 8 real runs"}}))
    assert get_profile("cpu-tiny").calibration != "fitted to 8 real runs"
    monkeypatch.setenv(CALIBRATION_ENV, str(path))
    p = get_profile("cpu-tiny")
    assert (p.step_overhead_s, p.per_seq_overhead_s, p.per_token_overhead_s) == PLANTED
    assert p.calibration == "fitted to 8 real runs"
    assert get_profile("H100-80G") == get_profile("H100-80G", calibrated=False), "only the profiles it names"
