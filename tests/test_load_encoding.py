"""results.nc string layout (servetune.netcdf): fast to load, exact round trip, plain netCDF, old files still read."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest
import xarray as xr

from analysis.load import load
from analysis.synthetic import planted
from coordinator.dataset import build_dataset, write_dataset
from coordinator.store import Store
from servetune.manifest import plan_grid
from servetune.netcdf import ALWAYS_FIXED_CHARS, FIXED, VARIABLE_LENGTH, string_layout, write_netcdf
from servetune.spec import parse_spec

SPEC = """
name: encoding-test
engine: {grid: {max_num_seqs: [2, 4]}, fixed: {max_model_len: 256}}
load_points:
  - {name: a, request_rate: 1, num_requests: 2, input_len: 8, output_len: 8}
"""

UNICODE = "débit 漢字 🙂"


def _strings(values: list[str]) -> np.ndarray:
    return np.asarray(values, dtype=object)


def _dataset(n: int = 40) -> xr.Dataset:
    """A SYNTHETIC experiment plus string coordinates that exercise every layout case."""
    ds, _ = planted(n_configs=n, n_params=6, seed=3)
    rows = ds.sizes["trial"]
    assert rows >= 6
    unicode = [UNICODE if i % 3 == 0 else "" for i in range(rows)]
    long_sparse = ["x" * 500 if i == 1 else "" for i in range(rows)]  # one long error among empty ones
    return ds.assign_coords(
        param_env_note=("trial", _strings(unicode)),
        error=("trial", _strings(long_sparse)),
        stopped_early=("trial", _strings([""] * rows)),
    )


def _layout(path: Path, name: str) -> str:
    """How ``name`` is stored in ``path``: "char" (fixed-width, utf-8), "vlen" or something else."""
    with h5py.File(path, "r") as f:
        var = f[name]
        if var.dtype == np.dtype("S1") and var.ndim == 2 and var.attrs.get("_Encoding") in ("utf-8", b"utf-8"):
            return "char"
        info = h5py.check_string_dtype(var.dtype)
        if info is not None and info.length is None:
            return "vlen"
        return str(var.dtype)


def _assert_same(loaded: xr.Dataset, expected: xr.Dataset, attrs: bool = True) -> None:
    if attrs:
        xr.testing.assert_identical(loaded, expected)
    else:
        xr.testing.assert_equal(loaded, expected)
    for name, var in expected.variables.items():
        assert loaded[name].dtype == var.dtype, name
        if var.dtype == object:
            got = loaded[name].values.tolist()
            assert got == var.values.tolist(), name
            assert all(type(v) is str for v in got), name


def test_round_trip_is_exact_and_strings_are_char_arrays(tmp_path: Path) -> None:
    ds = _dataset()
    path = tmp_path / "results.nc"
    write_netcdf(ds, path)
    _assert_same(load(path), ds)
    for name in ("trial_id", "config_id", "config_label", "status", "param_env_note", "stopped_early"):
        assert _layout(path, name) == "char", name
    assert _layout(path, "error") == "vlen"  # 500-wide padding for one message: kept variable-length


def test_plain_xarray_reads_the_same_strings(tmp_path: Path) -> None:
    ds = _dataset()
    path = tmp_path / "results.nc"
    write_netcdf(ds, path)
    with xr.open_dataset(path) as plain:  # no servetune code, default engine and decoding
        for name, var in ds.coords.items():
            if var.dtype == object:
                assert plain[name].values.tolist() == var.values.tolist(), name
        assert UNICODE in plain["param_env_note"].values.tolist()


def test_files_with_variable_length_strings_still_load(tmp_path: Path) -> None:
    ds = _dataset()
    path = tmp_path / "results.nc"
    old_rule = {k: {"dtype": str} for k, v in ds.coords.items() if v.dtype == object}  # the writer until now
    ds.to_netcdf(path, engine="h5netcdf", encoding=old_rule)
    assert _layout(path, "trial_id") == "vlen"
    _assert_same(load(path), ds)


def test_a_loaded_dataset_rewrites_with_either_layout(tmp_path: Path) -> None:
    ds = _dataset()
    old, new, again = tmp_path / "old.nc", tmp_path / "new.nc", tmp_path / "again.nc"
    ds.to_netcdf(old, engine="h5netcdf", encoding={k: {"dtype": str} for k, v in ds.coords.items() if v.dtype == object})
    write_netcdf(load(old), new)  # its variables carry the variable-length encoding they were read with
    assert _layout(new, "trial_id") == "char"
    write_netcdf(load(new), again)  # and now the char-array one
    _assert_same(load(again), ds)


@pytest.mark.parametrize(
    ("values", "layout"),
    [
        (["ok", "failed", ""], FIXED),
        (["", ""], FIXED),
        ([UNICODE, ""], FIXED),
        (["y" * ALWAYS_FIXED_CHARS] + [""] * 99, FIXED),  # short enough: padding is cheap
        (["z" * 300] * 10, FIXED),  # wide but uniform (config labels)
        (["z" * 300] + [""] * 9, VARIABLE_LENGTH),  # wide and sparse (error messages)
        (["a", b"b"], VARIABLE_LENGTH),
        ([], VARIABLE_LENGTH),
    ],
)
def test_string_layout_rule(values: list[object], layout: dict[str, object]) -> None:
    arr = np.empty(len(values), dtype=object)
    arr[:] = values
    assert string_layout(arr) == layout


@pytest.mark.parametrize("value", ["a\x00", "a\x00b"])
def test_a_nul_character_is_refused_by_name(tmp_path: Path, value: str) -> None:
    ds = xr.Dataset(coords={"error": ("trial", _strings(["", value]))})
    with pytest.raises(ValueError, match="'error' holds a NUL"):
        write_netcdf(ds, tmp_path / "results.nc")
    assert not (tmp_path / "results.nc").exists()


def _store(tmp_path: Path) -> Store:
    spec = parse_spec(SPEC)
    plan = plan_grid(spec)
    store = Store.open(tmp_path / "exp")
    store.record_plan(spec.spec_hash(), spec.model_dump(mode="json"), SPEC, plan)
    t0, t1 = [m.trial_id for m in plan.trials()]
    a = store.begin_attempt(t0, daemon_id="d", batch_id="b", spec_hash="h")
    store.finish_attempt(t0, a, status="ok", failure_kind=None, error=None, submission_id="s", record={"m": 1},
                         metrics={"output_throughput": 7.5}, hardware_class="cpu-2c-AVX2")
    a = store.begin_attempt(t1, daemon_id="d", batch_id="b", spec_hash="h")
    store.finish_attempt(t1, a, status="failed", failure_kind="measurement", error=f"OOM {UNICODE}",
                         submission_id="s2", record={"m": 2}, metrics={}, hardware_class="cpu-2c-AVX2")
    return store


def test_coordinator_writes_the_shared_layout(tmp_path: Path) -> None:
    store = _store(tmp_path)
    path = write_dataset(store)
    for name in ("trial_id", "config_id", "config_label", "status", "error"):
        assert _layout(path, name) == "char", name
    expected = build_dataset(store)
    _assert_same(load(tmp_path / "exp"), expected, attrs=False)  # created_at_us differs per build
    assert f"OOM {UNICODE}" in load(path).error.values.tolist()


def test_coordinator_keeps_a_result_whose_error_holds_a_nul(tmp_path: Path) -> None:
    """A server log tail with a NUL in a failure's error must not stop results.nc from being written."""
    spec = parse_spec(SPEC)
    plan = plan_grid(spec)
    store = Store.open(tmp_path / "exp")
    store.record_plan(spec.spec_hash(), spec.model_dump(mode="json"), SPEC, plan)
    t0 = plan.trials()[0].trial_id
    a = store.begin_attempt(t0, daemon_id="d", batch_id="b", spec_hash="h")
    store.finish_attempt(t0, a, status="failed", failure_kind="measurement", error="died: \x00\x00 garbage",
                         submission_id="s", record={"m": 1}, metrics={}, hardware_class="cpu-2c-AVX2")
    errors = load(write_dataset(store)).error.values.tolist()
    assert "died: \ufffd\ufffd garbage" in errors, errors
