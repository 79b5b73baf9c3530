"""From an experiment's xarray dataset to the flat tables the analyses work on.

Every analysis in this package starts here:

- :func:`parameters` finds the swept engine parameters (``param_*`` coordinates) and their kinds;
- :func:`trial_table` flattens the dataset into one pandas row per trial, with quantile variables
  spread into columns (``ttft_ms_p99``) and the derived metrics added (:data:`DERIVED_METRICS`);
- :func:`design_matrix` encodes parameters as numbers for surrogate models;
- :func:`metric_sense` says whether more of a metric is better.

Derived metrics (added by :func:`trial_table`):

``output_tokens_per_user``
    output throughput / concurrency, as vLLM's Pareto plot defines it. Concurrency is the load
    point's ``max_concurrency``; for open-loop load points without a cap it is the mean number of
    requests in flight by Little's law (request throughput x mean end-to-end latency), and
    ``concurrency_source`` says which was used.
``output_tokens_per_gpu``
    output throughput / GPUs the config used (``tensor_parallel_size``, default 1; a CPU node
    counts as one device).
``output_tokens_per_dollar``
    output tokens per US dollar, when the spec priced the trial's hardware class
    (``gpu_hour_prices``: USD per GPU-hour by hardware class); NaN otherwise, never invented.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pandas as pd
import xarray as xr

from servetune.schema import QUANTILE_VARIABLES, SCALAR_VARIABLES

PARAM_PREFIX = "param_"

DERIVED_METRICS: tuple[str, ...] = ("output_tokens_per_user", "output_tokens_per_gpu", "output_tokens_per_dollar")

_HIGHER_IS_BETTER = {
    "request_throughput", "output_throughput", "total_token_throughput", "request_goodput", "slo_attainment",
    "slos_met", "achieved_rate", "n_completed", "server_prefix_cache_hit_rate", *DERIVED_METRICS,
}
_LOWER_IS_BETTER_PREFIXES = ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms", "mean_ttft_ms", "mean_tpot_ms",
                             "mean_itl_ms", "mean_e2el_ms", "n_errors", "sched_lag_p99_ms", "server_startup_s",
                             "server_preemptions_delta", "server_max_waiting")

ParamKind = Literal["numeric", "bool", "categorical"]


class AnalysisInputError(ValueError):
    """The data or the request cannot support the asked analysis (names the offending value)."""


@dataclass(frozen=True)
class Parameter:
    """One swept parameter: ``name`` as users write it (``max_num_seqs``, ``env.VLLM_X``), the
    dataset ``column`` holding it, its ``kind`` and its observed ``levels`` (sorted, missing left out).

    ``log`` is true for positive numeric parameters spanning a ratio of 8 or more (batch sizes,
    token budgets): models and plots then use their log2. A string parameter (an environment
    variable) that some configs leave unset has ``""`` (vLLM's default) as one of its levels.
    """

    name: str
    column: str
    kind: ParamKind
    levels: tuple[Any, ...]
    log: bool = False

    def encode(self, values: Sequence[Any] | np.ndarray | pd.Series) -> np.ndarray:
        """Numbers for a model: log2 or raw for numeric, 0/1 for bool, level index for categorical.
        Missing values (vLLM's default: the flag was not passed) become NaN; for a categorical
        parameter with an ``""`` level (an environment variable left unset) they become that level.

        Vectorised: numeric arrays are converted as a whole; otherwise each distinct value is
        encoded once (``math.log2`` per distinct value, so a value always gets the same bits) and
        the codes are spread back with one take."""
        arr = _as_array(values)
        n = len(arr)
        default = self.levels.index("") if self.kind == "categorical" and "" in self.levels else None
        if n == 0:
            return np.full(0, np.nan)
        if arr.dtype.kind in "biuf" and self.kind != "categorical":
            x = arr.astype(float)
            missing = np.isnan(x)
            if self.kind == "bool":
                return np.where(missing, np.nan, np.where(x != 0, 1.0, 0.0))
            if not self.log:
                return x
        try:
            codes, uniq = pd.factorize(arr.astype(object) if arr.dtype.kind in "biufUS" else arr,
                                       use_na_sentinel=False)
        except TypeError:  # unhashable values: encode them one by one
            return np.array([self._encode_one(v, default) for v in arr.tolist()], dtype=float)
        enc = np.array([self._encode_one(v, default) for v in np.asarray(uniq, dtype=object).tolist()],
                       dtype=float)
        return np.asarray(enc[np.asarray(codes, dtype=np.intp)], dtype=float)

    def _encode_one(self, v: Any, default: int | None) -> float:
        """One value's number (the rule :meth:`encode` applies to every distinct value)."""
        if _missing(v):
            return float(default) if default is not None else math.nan
        if self.kind == "numeric":
            x = float(v)
            return math.log2(x) if self.log else x
        if self.kind == "bool":
            return 1.0 if _truthy(v) else 0.0
        return float(self.levels.index(v)) if v in self.levels else math.nan

    def decode(self, x: float) -> Any:
        """The parameter value for an encoded number (the nearest level for bool/categorical)."""
        if self.kind == "numeric":
            return 2.0 ** x if self.log else x
        idx = int(round(x))
        if self.kind == "bool":
            return bool(idx)
        return self.levels[max(0, min(len(self.levels) - 1, idx))]


def _as_array(values: Sequence[Any] | np.ndarray | pd.Series) -> np.ndarray:
    """``values`` as a 1-D numpy array: arrays and Series keep their dtype (pandas' string and
    categorical columns become objects), anything else becomes an object array."""
    if isinstance(values, (pd.Series, pd.Index)):
        arr = values.to_numpy()
        return arr if arr.dtype.kind in "biuf" else np.asarray(arr, dtype=object)
    if isinstance(values, np.ndarray):
        return values.reshape(-1) if values.ndim != 1 else values
    return np.asarray(values, dtype=object).reshape(-1)


def _missing(v: Any) -> bool:
    if v is None:
        return True
    if isinstance(v, float) and math.isnan(v):
        return True
    return isinstance(v, str) and v == ""


def _truthy(v: Any) -> bool:
    if isinstance(v, str):
        return v.lower() in ("1", "true", "yes", "on")
    return bool(v)


def parameters(ds: xr.Dataset, names: Sequence[str] | None = None, include_constant: bool = False) -> list[Parameter]:
    """The swept parameters of ``ds`` (those taking more than one value), or exactly ``names``.

    Raises :class:`AnalysisInputError` naming an unknown parameter."""
    columns = [str(c) for c in ds.coords if str(c).startswith(PARAM_PREFIX)]
    by_name = {c.removeprefix(PARAM_PREFIX): c for c in columns}
    if names is not None:
        unknown = [n for n in names if n not in by_name]
        if unknown:
            raise AnalysisInputError(
                f"unknown parameter {unknown[0]!r}; the dataset has: {', '.join(sorted(by_name)) or 'none'}")
        chosen = [by_name[n] for n in names]
    else:
        chosen = columns
    out: list[Parameter] = []
    for col in chosen:
        values = ds[col].values
        p = _describe(col, values)
        if names is not None or include_constant or len(p.levels) > 1:
            out.append(p)
    return out


def _describe(column: str, values: np.ndarray) -> Parameter:
    present = [v for v in values.tolist() if not _missing(v)]
    name = column.removeprefix(PARAM_PREFIX)
    if values.dtype == bool or (present and all(isinstance(v, bool) for v in present)):
        return Parameter(name, column, "bool", tuple(sorted({bool(v) for v in present})))
    if values.dtype.kind in "if":
        levels = tuple(sorted({float(v) for v in present}))
        levels = tuple(int(v) if float(v).is_integer() else v for v in levels)
        log = bool(levels) and min(levels) > 0 and max(levels) / min(levels) >= 8
        return Parameter(name, column, "numeric", levels, log)
    strs = sorted({str(v) for v in present})
    if strs and set(s.lower() for s in strs) <= {"true", "false", "0", "1"}:
        return Parameter(name, column, "bool", tuple(_truthy(s) for s in strs))
    try:
        nums = [float(s) for s in strs]
    except ValueError:
        # an environment variable some configs leave unset: "" (vLLM's default) is a level of its own
        unset = len(present) < len(values) and values.dtype.kind in "OUS"
        return Parameter(name, column, "categorical", (("",) if unset else ()) + tuple(strs))
    levels_n = tuple(sorted(set(nums)))
    log = bool(levels_n) and min(levels_n) > 0 and max(levels_n) / min(levels_n) >= 8
    return Parameter(name, column, "numeric", levels_n, log)


def metric_sense(metric: str) -> int:
    """+1 when more of ``metric`` is better (throughput), -1 when less is (latency, errors)."""
    if metric in _HIGHER_IS_BETTER:
        return 1
    if metric.startswith(_LOWER_IS_BETTER_PREFIXES):
        return -1
    raise AnalysisInputError(f"unknown metric {metric!r}; known: {', '.join(known_metrics())}")


def known_metrics() -> list[str]:
    qnames = [f"{v}_p{q}" for v in QUANTILE_VARIABLES for q in (50, 90, 95, 99)]
    return [*SCALAR_VARIABLES, *qnames, *DERIVED_METRICS]


def quantile_column(var: str, q: float) -> str:
    """``ttft_ms`` at 0.99 -> ``ttft_ms_p99`` (0.999 -> ``ttft_ms_p99.9``)."""
    pct = q * 100
    return f"{var}_p{int(round(pct))}" if abs(pct - round(pct)) < 1e-9 else f"{var}_p{pct:g}"


#: the columns :func:`trial_table` derives (after the dataset's own), in the order it adds them
DERIVED_COLUMNS: tuple[str, ...] = ("concurrency", "concurrency_source", "output_tokens_per_user", "gpus",
                                    "output_tokens_per_gpu", "gpu_hour_price", "output_tokens_per_dollar")


def table_columns(ds: xr.Dataset) -> list[str]:
    """The columns :func:`trial_table` would give ``ds``, in its order, without building anything."""
    cols: list[str] = [str(name) for name, coord in ds.coords.items()
                       if coord.dims == ("trial",) and name != "trial"]
    for name, var in ds.data_vars.items():
        if var.dims == ("trial",):
            cols.append(str(name))
        elif var.dims == ("trial", "quantile"):
            cols.extend(quantile_column(str(name), float(q)) for q in ds["quantile"].values.tolist())
    return list(dict.fromkeys([*cols, *DERIVED_COLUMNS]))


def trial_table(ds: xr.Dataset, columns: Sequence[str] | None = None) -> pd.DataFrame:
    """One row per trial: every ``trial`` coordinate, every scalar variable, quantile variables as
    ``<var>_p<q>`` columns and the derived metrics; the index is the dataset's ``trial`` index.

    ``columns`` (the lean path, for large datasets): build only these columns, in this order, with
    the same values and dtypes as the full table's; derived columns are computed only when named
    (from the dataset columns they need, whether named or not). Names the dataset does not have are
    left out, so a caller's own check (``metric in df``) still reports them. :func:`table_columns`
    lists what the full table holds.
    """
    if columns is not None:
        return lean_table(ds, columns, strings="str")
    cols: dict[str, Any] = {}
    for name, coord in ds.coords.items():
        if coord.dims == ("trial",) and name != "trial":
            cols[str(name)] = coord.values
    for name, var in ds.data_vars.items():
        if var.dims == ("trial",):
            cols[str(name)] = var.values
        elif var.dims == ("trial", "quantile"):
            for j, q in enumerate(ds["quantile"].values.tolist()):
                cols[quantile_column(str(name), float(q))] = var.values[:, j]
    df = pd.DataFrame(cols, index=pd.Index(ds["trial"].values, name="trial"))
    _add_derived(df, _prices(ds))
    return df


def _column_of(ds: xr.Dataset, name: str, quantiles: dict[str, tuple[str, int]]) -> np.ndarray | None:
    """The values of one non-derived table column taken straight from ``ds`` (None: no such column)."""
    if name in ds.coords and name != "trial" and ds.coords[name].dims == ("trial",):
        return np.asarray(ds.coords[name].values)
    if name in ds.data_vars and ds[name].dims == ("trial",):
        return np.asarray(ds[name].values)
    if name in quantiles:
        var, j = quantiles[name]
        return np.asarray(ds[var].values[:, j])
    return None


def lean_table(ds: xr.Dataset, columns: Sequence[str], strings: Literal["str", "object"] = "object") -> pd.DataFrame:
    """``trial_table(ds, columns=columns)``, and with ``strings="object"`` (the default here) text
    columns keep the dataset's numpy object arrays instead of being converted to pandas' string
    dtype: the same values, without a pass over a million strings per column. For tables a caller
    uses internally (:func:`analysis.pareto.front` and :func:`analysis.ranking.rank` without
    ``table=``); :func:`trial_table` gives pandas' dtypes."""
    quantiles: dict[str, tuple[str, int]] = {}
    if "quantile" in ds.coords:
        qs = ds["quantile"].values.tolist()
        for name, var in ds.data_vars.items():
            if var.dims == ("trial", "quantile"):
                for j, q in enumerate(qs):
                    quantiles[quantile_column(str(name), float(q))] = (str(name), j)
    wanted = list(dict.fromkeys(str(c) for c in columns))
    derived: dict[str, np.ndarray] = {}
    if any(c in DERIVED_COLUMNS for c in wanted):
        def num(name: str) -> np.ndarray | None:
            v = _column_of(ds, name, quantiles)
            return None if v is None else np.asarray(v, dtype=float)

        n = int(ds.sizes["trial"])
        derived = _derived(num, _column_of(ds, "hardware_class", quantiles), n, _prices(ds))
    index = pd.Index(ds["trial"].values, name="trial")
    cols: dict[str, Any] = {}
    for c in wanted:
        v = derived[c] if c in derived else _column_of(ds, c, quantiles)
        if v is not None:
            cols[c] = v
    if strings == "str":
        return pd.DataFrame(cols, index=index)
    # column by column: no str conversion and no consolidation copy (a handful of columns)
    out = pd.DataFrame(index=index)
    for c, v in cols.items():
        text = v.dtype.kind in "OUS"
        out[c] = pd.Series(v.astype(object) if v.dtype.kind in "US" else v, index=index,
                           dtype=object if text else None, copy=False)
    return out


def _prices(ds: xr.Dataset) -> dict[str, float]:
    raw = ds.attrs.get("gpu_hour_prices", "")
    if not raw:
        return {}
    data = json.loads(raw) if isinstance(raw, str) else dict(raw)
    return {str(k): float(v) for k, v in data.items()}


def _add_derived(df: pd.DataFrame, prices: dict[str, float]) -> None:
    def num(name: str) -> np.ndarray | None:
        return df[name].to_numpy(dtype=float) if name in df else None

    hw = df["hardware_class"] if "hardware_class" in df else None
    for name, values in _derived(num, hw, len(df), prices).items():
        df[name] = values


def _derived(num: Any, hardware_class: Any, n: int, prices: dict[str, float]) -> dict[str, np.ndarray]:
    """The :data:`DERIVED_COLUMNS` from ``num(column)`` (float values of a table column, None when
    absent) and the hardware classes (None when absent)."""
    nan = np.full(n, np.nan)
    out_tp = num("output_throughput")
    out_tp = nan if out_tp is None else out_tp
    conc = num("max_concurrency")
    conc = nan if conc is None else conc
    source = np.where(np.isfinite(conc), "max_concurrency", "littles_law")
    req_tp, e2el = num("request_throughput"), num("mean_e2el_ms")
    little = req_tp * e2el / 1000.0 if req_tp is not None and e2el is not None else nan
    conc = np.where(np.isfinite(conc), conc, little)
    d: dict[str, np.ndarray] = {}
    with np.errstate(divide="ignore", invalid="ignore"):
        d["concurrency"] = conc
        d["concurrency_source"] = np.where(np.isfinite(conc), source, "")
        d["output_tokens_per_user"] = np.where(conc > 0, out_tp / conc, np.nan)
        tp = num("param_tensor_parallel_size")
        tp = np.ones(n) if tp is None else tp
        gpus = np.where(np.isfinite(tp) & (tp > 0), tp, 1.0)
        d["gpus"] = gpus
        d["output_tokens_per_gpu"] = out_tp / gpus
        if hardware_class is not None and prices:
            price = pd.Series(np.asarray(hardware_class)).map(prices).to_numpy(dtype=float)  # unpriced: NaN
        else:
            price = np.full(n, np.nan)
        d["gpu_hour_price"] = price
        d["output_tokens_per_dollar"] = out_tp * 3600.0 / (gpus * price)
    return d


def design_matrix(df: pd.DataFrame, params: Sequence[Parameter]) -> np.ndarray:
    """``len(df) x len(params)`` float matrix of encoded parameter values (see :meth:`Parameter.encode`)."""
    if not params:
        return np.empty((len(df), 0))
    return np.column_stack([p.encode(df[p.column].to_numpy()) for p in params])


def filter_trials(
    df: pd.DataFrame,
    status: str | Sequence[str] | None = None,
    load_point: str | Sequence[str] | None = None,
    dataset: str | Sequence[str] | None = None,
    hardware_class: str | Sequence[str] | None = None,
    include_baseline: bool = False,
    **param_values: Any,
) -> pd.DataFrame:
    """Rows matching every given filter. A parameter filter is a value, a list of values, or a
    ``(low, high)`` tuple (inclusive) for numeric parameters, keyed by parameter name."""
    mask = np.ones(len(df), dtype=bool)
    for col, want in (("status", status), ("load_point", load_point), ("dataset", dataset),
                      ("hardware_class", hardware_class)):
        if want is None:
            continue
        wanted = [want] if isinstance(want, str) else list(want)
        mask &= df[col].astype(str).isin(wanted).to_numpy()
    if not include_baseline and "is_baseline" in df:
        mask &= ~df["is_baseline"].astype(bool).to_numpy()
    for name, want in param_values.items():
        col = PARAM_PREFIX + name
        if col not in df:
            raise AnalysisInputError(f"unknown parameter {name!r} in a filter")
        values = df[col]
        if isinstance(want, tuple) and len(want) == 2:
            num = pd.to_numeric(values, errors="coerce").to_numpy(dtype=float)
            mask &= (num >= float(want[0])) & (num <= float(want[1]))
        elif isinstance(want, (list, set, frozenset)):
            mask &= values.isin(list(want)).to_numpy()
        else:
            mask &= (values == want).to_numpy()
    return df[mask]


def groups(df: pd.DataFrame, by: Sequence[str] = ("load_point", "hardware_class")) -> list[tuple[dict[str, str], pd.DataFrame]]:
    """Split ``df`` into scenario x hardware-class groups (incomparable hardware never shares a ranking)."""
    keys = [k for k in by if k in df]
    if not keys:
        return [({}, df)]
    out = []
    for values, sub in df.groupby(keys, sort=True):
        vals = values if isinstance(values, tuple) else (values,)
        out.append(({k: str(v) for k, v in zip(keys, vals)}, sub))
    return out


@dataclass(frozen=True)
class Alias:
    """Two parameter settings that the design never separates: across the distinct engine configs,
    ``a == a_level`` holds exactly where ``b == b_level`` does (``"default"``: left at vLLM's
    default), in ``n_configs`` of ``of_configs`` configs. Their effects cannot be told apart."""

    a: str
    a_level: str
    b: str
    b_level: str
    n_configs: int
    of_configs: int

    @property
    def sentence(self) -> str:
        return (f"{self.a}={self.a_level} occurs exactly in the configs with {self.b}={self.b_level} "
                f"({self.n_configs} of {self.of_configs} configs): the design confounds them, so no analysis can "
                f"tell their effects apart; vary them independently to separate them")


def aliases(ds: xr.Dataset) -> list[Alias]:
    """Aliased parameter settings among the experiment's distinct non-baseline configs.

    Every parameter that varies counts, including one set in some configs and left at vLLM's
    default in the others (which :func:`parameters` leaves out, as it has a single explicit level):
    its levels are that value and ``default``. For each pair of parameters, a level indicator of
    one that equals a level indicator of the other over the configs (neither always true nor always
    false) is an alias; for two-level parameters the complementary pair is the same alias and is
    reported once. Cost: the distinct configs times the pairs of their levels (small)."""
    cols = [str(c) for c in ds.coords if str(c).startswith(PARAM_PREFIX)]
    if not cols or "config_id" not in ds.coords:
        return []
    keep = np.ones(int(ds.sizes.get("trial", 0)), dtype=bool)
    if "is_baseline" in ds.coords or "is_baseline" in ds.data_vars:
        keep &= ~np.asarray(ds["is_baseline"].values, dtype=bool)
    _, first = np.unique(np.asarray(ds["config_id"].values, dtype=object)[keep].astype(str), return_index=True)
    rows = np.flatnonzero(keep)[np.sort(first)]
    n_cfg = len(rows)
    if n_cfg < 2:
        return []
    indicators: list[tuple[str, str, np.ndarray]] = []  # (param, level, mask over configs)
    n_levels: dict[str, int] = {}
    for col in cols:
        values = np.asarray(ds[col].values)[rows]
        labels = np.array(["default" if _missing(v) else str(v) for v in values.tolist()], dtype=object)
        levels = sorted(set(labels.tolist()))
        if len(levels) < 2:
            continue
        name = col.removeprefix(PARAM_PREFIX)
        n_levels[name] = len(levels)
        indicators += [(name, lv, labels == lv) for lv in levels]
    out: list[Alias] = []
    seen: set[tuple[str, str]] = set()
    for i, (a, la, ma) in enumerate(indicators):
        for b, lb, mb in indicators[i + 1:]:
            if a == b or not np.array_equal(ma, mb):
                continue
            if n_levels[a] == 2 and n_levels[b] == 2 and (a, b) in seen:
                continue  # the complement of an alias already named
            seen.add((a, b))
            out.append(Alias(a, la, b, lb, int(ma.sum()), n_cfg))
    return out
