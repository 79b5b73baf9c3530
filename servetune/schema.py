"""The results dataset's shape, shared by the coordinator (which writes it) and analysis (which reads it).

One consolidated file per experiment, ``<results root>/<name>/results.nc`` (netCDF4 via h5netcdf),
rewritten atomically by the coordinator after each result. Shape:

Dimensions
    ``trial`` (one row per trial: its latest finished attempt, or its hole) and ``quantile``.
Coordinates on ``trial``
    ``trial_id``, ``attempt`` (0 for a hole), ``config_id``, ``experiment``, ``load_point``,
    ``repeat``, ``status`` (ok / failed / hole), ``failure_kind`` ("" when none), ``is_baseline``,
    ``baseline_run`` (-1 when not a baseline), ``started_at`` (int64 microseconds since the epoch,
    0 for a hole), ``hardware_class``, ``backend``, ``spec_hash`` (the spec that first planned the
    trial), ``in_current_spec``, ``stopped_early`` and ``client_fell_behind``, the load point's
    ``request_rate``/``max_concurrency``/``input_len``/``output_len`` (NaN when unset), and one
    ``param_<name>`` coordinate per engine arg or ``param_env.<NAME>`` per environment variable
    set in any config (NaN or "" where a config leaves it to vLLM's default).
Variables on ``trial``
    ``request_throughput``, ``output_throughput``, ``total_token_throughput``, ``request_goodput``,
    ``n_requests``, ``n_completed``, ``n_errors``, ``duration_s``, ``total_input_tokens``,
    ``total_output_tokens``, ``slo_attainment``, ``slos_met`` (1/0/NaN), ``achieved_rate``,
    ``offered_rate``, ``sched_lag_p99_ms``, ``server_requests_delta``,
    ``server_generation_tokens_delta``, ``kv_cache_tokens``, ``server_startup_s``, and
    ``mean_ttft_ms``, ``mean_tpot_ms``, ``mean_itl_ms``, ``mean_e2el_ms``.
Variables on ``trial x quantile``
    ``ttft_ms``, ``tpot_ms``, ``itl_ms``, ``e2el_ms``.
Attributes
    ``schema_version``, ``experiment``, ``spec_hash``, ``design``, ``randomized``,
    ``planner_seed``, ``run_order`` (JSON list of trial ids in planned order), ``vllm_version``,
    ``model`` (JSON identity), ``created_at``, ``swept_parameters`` (JSON list), ``slos`` (JSON).

Per-request samples and server-metric time series are per-trial artifacts under
``results/<trial_id>/``, not dataset variables.
"""

from __future__ import annotations

SCHEMA_VERSION = 1
DATASET_FILE = "results.nc"
DB_FILE = "experiment.sqlite"

SCALAR_VARIABLES: tuple[str, ...] = (
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    "request_goodput",
    "n_requests",
    "n_completed",
    "n_errors",
    "duration_s",
    "total_input_tokens",
    "total_output_tokens",
    "slo_attainment",
    "slos_met",
    "achieved_rate",
    "offered_rate",
    "sched_lag_p99_ms",
    "server_requests_delta",
    "server_generation_tokens_delta",
    "kv_cache_tokens",
    "server_startup_s",
    "mean_ttft_ms",
    "mean_tpot_ms",
    "mean_itl_ms",
    "mean_e2el_ms",
)
QUANTILE_VARIABLES: tuple[str, ...] = ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms")
STATUSES: tuple[str, ...] = ("ok", "failed", "hole")
