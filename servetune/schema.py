"""The results dataset's shape, shared by the coordinator (which writes it) and analysis (which reads it).

One consolidated file per experiment, ``<results root>/<name>/results.nc`` (netCDF4 via h5netcdf),
rewritten atomically by the coordinator after each result. Shape:

Dimensions
    ``trial`` (one row per trial: its latest finished attempt, or its hole) and ``quantile``.
Coordinates on ``trial``
    ``trial_id``, ``attempt`` (0 for a hole), ``config_id``, ``experiment``, ``load_point``,
    ``repeat``, ``status`` (ok / failed / hole), ``failure_kind`` ("" when none), ``is_baseline``,
    ``baseline_run`` (-1 when not a baseline), ``started_at`` (int64 microseconds since the epoch,
    0 for a hole), ``hardware_class``, ``daemon_key_id`` (the key id, :func:`servetune.keys.key_id`,
    of the CURVE key of the daemon that produced the row; "" for a hole or an older store),
    ``backend``, ``spec_hash`` (the spec that first planned the
    trial), ``in_current_spec``, ``stopped_early`` ("" or why a stop condition ended the load point
    early: the trial is still ok, its metrics cover what ran), ``retry_warning`` ("" or, for a result
    that came after attempts lost to transport in its sweep, e.g. "produced on attempt 2 of 3 after
    1 transport failure(s) on node-b"; ``runs/<name>/retries.jsonl`` has each loss) and
    ``client_fell_behind``, the load point's
    ``request_rate``/``max_concurrency`` (NaN when unset), ``input_len``/``output_len`` (mean
    tokens of the load point's distributions; NaN for file datasets), ``dataset`` (random /
    shared_prefix / sharegpt / jsonl), ``dataset_sha256`` (file datasets), ``endpoint``
    (completions / chat), ``arrival`` (poisson / constant / gamma / closed-loop) and
    ``burstiness``, ``hardware_target`` (the spec's hardware target the trial was planned for: a
    class, or ``filter:<name>``; "" when the spec names none), ``tags`` (comma-separated; a trial moved
    by failover carries ``failover-from:<class or daemon>``; "" for none), ``fidelity`` (1 for a full
    trial; below 1 for a successive-halving rung measured on that fraction of its load point's
    requests or duration: ``analysis.load`` leaves those out unless asked, ``fidelity="all"``), and one
    ``param_<name>`` coordinate per engine arg or ``param_env.<NAME>`` per environment variable
    set in any config (NaN or "" where a config leaves it to vLLM's default).
Variables on ``trial``
    ``request_throughput``, ``output_throughput``, ``total_token_throughput``, ``request_goodput``,
    ``n_requests``, ``n_completed``, ``n_errors``, ``n_cancelled`` (requests the load generator
    cancelled itself: end of window, early stop; not in ``n_requests``), ``duration_s``, ``total_input_tokens``,
    ``total_output_tokens``, ``slo_attainment``, ``slos_met`` (1/0/NaN), ``achieved_rate``,
    ``offered_rate`` (nominal), ``scheduled_rate`` (what the seeded arrival schedule asked for; see
    ``servetune.metrics.TrialMetrics``), ``sched_lag_p99_ms``, ``loop_lag_p99_ms`` and
    ``loop_lag_max_ms`` (the client's event-loop lag, ``daemon.looplag``; NaN when not measured), ``server_requests_delta``,
    ``server_generation_tokens_delta``, ``kv_cache_tokens``, ``server_startup_s``, the summary of the
    server-metric series (``server_max_running``, ``server_max_waiting``,
    ``server_max_kv_cache_usage`` (0-1), ``server_preemptions_delta``,
    ``server_prefix_cache_hit_rate``; see ``servetune.metrics.server_summary``), and
    ``mean_ttft_ms``, ``mean_tpot_ms``, ``mean_itl_ms``, ``mean_e2el_ms``.
Variables on ``trial x quantile``
    ``ttft_ms``, ``tpot_ms``, ``itl_ms``, ``e2el_ms``.
Attributes
    ``schema_version``, ``experiment``, ``spec_hash``, ``design`` (the planner's design:
    ``grid``, ``random`` or ``quasi-random``; "" when unknown), ``randomized`` (1 when the run
    order was shuffled under the seed, else 0), ``planner_seed``, ``run_order`` (JSON list of
    trial ids in planned order), ``vllm_version``, ``hardware_classes`` (comma-separated),
    ``model`` (JSON identity), ``created_at_us``, ``swept_parameters`` (JSON list), ``slos``
    (JSON), ``ranking`` (JSON), ``gpu_hour_prices`` (JSON object: hardware class, as the
    ``hardware_class`` coordinate names it, -> US dollars per GPU-hour, from the current spec's
    optional ``gpu_hour_prices``; ``"{}"`` when the spec gives none), ``pruned_configs`` (JSON
    list: the engine configs planning left out before any trial because they cannot fit in device
    memory, each ``{config_id, config_label, hardware_target ("" for none), is_baseline, reason}``;
    ``"[]"`` when none was: :mod:`servetune.memfit`).

Per-request samples and server-metric time series are per-trial artifacts under
``results/<trial_id>/`` (``outcome.samples`` and ``outcome.server_series`` of each attempt's
result JSON), not dataset variables.
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
    "n_cancelled",
    "duration_s",
    "total_input_tokens",
    "total_output_tokens",
    "slo_attainment",
    "slos_met",
    "achieved_rate",
    "offered_rate",
    "scheduled_rate",
    "sched_lag_p99_ms",
    "loop_lag_p99_ms",
    "loop_lag_max_ms",
    "server_requests_delta",
    "server_generation_tokens_delta",
    "kv_cache_tokens",
    "server_startup_s",
    "server_max_running",
    "server_max_waiting",
    "server_max_kv_cache_usage",
    "server_preemptions_delta",
    "server_prefix_cache_hit_rate",
    "mean_ttft_ms",
    "mean_tpot_ms",
    "mean_itl_ms",
    "mean_e2el_ms",
)
QUANTILE_VARIABLES: tuple[str, ...] = ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms")
STATUSES: tuple[str, ...] = ("ok", "failed", "hole")
