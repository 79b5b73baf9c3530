"""The vLLM server lifecycle.

Fast tests need no vLLM: the Prometheus parser, failure classification, argv and environment,
and process-group handling with small real child processes standing in for the server. Tests
marked ``vllm`` start a real vLLM (CPU build) on the generated tiny model: one module-scoped
server for every check that needs one (a start costs ~45 s on 2 cores), plus one start that vLLM
refuses within seconds.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import pickle
import signal
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from daemon import promtext
from daemon.server import (
    ServerStartError,
    VLLMServer,
    classify_failure,
    cpu_list_string,
    is_cpu_node,
    omp_bind_value,
    parse_kv_cache,
    process_group_alive,
    vllm_command,
)
from daemon.tiny_model import generate
from servetune.manifest import EngineConfig
from servetune.spec import EngineArgs
from tests.conftest import group_members

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(not HAVE_VLLM, reason="vLLM is not installed")

# --------------------------------------------------------------------------- promtext

# Trimmed from a real vLLM 0.32 CPU /metrics answer after one 3-token-prompt, 4-token request.
METRICS_TEXT = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 0.0
vllm:num_requests_waiting{engine="0",model_name="tiny"} 0.0
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="tiny"} 3.0
vllm:prefix_cache_queries_created{engine="0",model_name="tiny"} 1.7959379275176153e+09
vllm:generation_tokens_total{engine="0",model_name="tiny"} 4.0
vllm:request_success_total{engine="0",finished_reason="stop",model_name="tiny"} 2.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="tiny"} 1.0
vllm:request_success_total{engine="0",finished_reason="abort",model_name="tiny"} 5.0
vllm:request_success_total{engine="0",finished_reason="error",model_name="tiny"} 0.0
vllm:request_success_created{engine="0",finished_reason="stop",model_name="tiny"} 1.7959379275179095e+09
vllm:e2e_request_latency_seconds_bucket{engine="0",le="0.3",model_name="tiny"} 1.0
vllm:e2e_request_latency_seconds_bucket{engine="0",le="+Inf",model_name="tiny"} 1.0
vllm:e2e_request_latency_seconds_count{engine="0",model_name="tiny"} 1.0
vllm:e2e_request_latency_seconds_sum{engine="0",model_name="tiny"} 0.25
vllm:cache_config_info{block_size="128",kv_cache_size_tokens="2097152",engine="0"} 1.0
"""


def test_promtext_totals_sum_label_sets_and_skip_buckets() -> None:
    totals = promtext.parse_totals(METRICS_TEXT)
    assert totals["vllm:request_success_total"] == 8.0
    assert totals["vllm:generation_tokens_total"] == 4.0
    assert totals["vllm:e2e_request_latency_seconds_sum"] == 0.25
    assert totals["vllm:e2e_request_latency_seconds_count"] == 1.0
    assert "vllm:e2e_request_latency_seconds_bucket" not in totals
    assert not any(name.endswith("_created") for name in totals)


def test_promtext_select_filters_labels() -> None:
    samples = promtext.parse_samples(METRICS_TEXT)
    name = "vllm:request_success_total"
    assert promtext.select(samples, name, {"finished_reason": "length"}) == 1.0
    assert promtext.select(samples, name, {"finished_reason": {"stop", "length", "repetition"}}) == 3.0
    assert promtext.select(samples, name, exclude={"finished_reason": {"abort", "error"}}) == 3.0
    assert promtext.select(samples, name, {"finished_reason": "repetition"}) is None
    assert promtext.select(samples, "vllm:absent_total") is None
    info = [s for s in samples if s.name == "vllm:cache_config_info"]
    assert info[0].labels["kv_cache_size_tokens"] == "2097152"


def test_promtext_odd_lines() -> None:
    text = (
        'm{path="a\\"b,c}",x="1\\n2"} 1 1700000000000\n'
        "plain 2.5\n"
        'inf_metric{le="+Inf"} +Inf\n'
        "nan_metric NaN\n"
        "# EOF\n"
        "broken{x= 1\n"
        "\n"
    )
    samples = promtext.parse_samples(text)
    assert [s.name for s in samples] == ["m", "plain", "inf_metric", "nan_metric"]
    assert samples[0].labels == {"path": 'a"b,c}', "x": "1\n2"}
    assert samples[0].value == 1.0
    assert math.isinf(samples[2].value) and math.isnan(samples[3].value)
    with pytest.raises(promtext.PromTextError, match="line 6"):
        promtext.parse_samples(text, strict=True)
    assert promtext.parse_types(METRICS_TEXT)["vllm:prefix_cache_queries"] == "counter"


# --------------------------------------------------------------------------- log parsing

# Lines as vLLM 0.32 writes them (the messages are vLLM's own strings).
KV_LINE = (
    "(EngineCore pid=4483) INFO 11-29 07:38:45 [kv_cache_utils.py:2327] CPU KV cache size: 2,097,152 tokens, "
    "Maximum concurrency for 512 tokens per request: 4096.00x"
)


def test_parse_kv_cache() -> None:
    assert parse_kv_cache("noise\n" + KV_LINE + "\nmore") == (2_097_152, 4096.0)
    gpu = "INFO [kv_cache_utils.py:1] GPU KV cache size: 1,234,560 tokens\nINFO Maximum concurrency for 8,192 tokens per request: 150.70x"
    assert parse_kv_cache(gpu) == (1_234_560, 150.7)
    assert parse_kv_cache("nothing here") == (None, None)


@pytest.mark.parametrize(
    ("log_line", "expected"),
    [
        (
            "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine",
            "no memory left for the KV cache",
        ),
        (
            "ValueError: To serve at least one request with the model's max seq len (32768), (4.0 GiB KV cache is needed, "
            "which is larger than the available KV cache memory (1.0 GiB). Based on the available memory, the estimated "
            "maximum model length is 8192. Try increasing `gpu_memory_utilization`",
            "KV cache too small for max_model_len (32768): the estimated maximum model length is 8192",
        ),
        (
            "ValueError: Free memory on device cuda:0 (10.1/79.1 GiB) on startup is less than desired GPU memory "
            "utilization (0.9, 71.2 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.",
            "not enough free device memory: Free memory on device cuda:0 (10.1/79.1 GiB)",
        ),
        (
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
            "out of memory: torch.OutOfMemoryError",
        ),
        ("OSError: [Errno 98] Address already in use", "port already in use"),
        (
            "api_server.py: error: argument --max-num-seqs: invalid int value: 'many'",
            "invalid arguments: argument --max-num-seqs: invalid int value: 'many'",
        ),
        (
            "  Value error, User-specified max_model_len (4096) is greater than the derived max_model_len "
            "(max_position_embeddings=2048.0 or model_max_length=None in model's config.json). "
            "[type=value_error, input_value=ArgsKwargs((), {'model': 'x'}), input_type=ArgsKwargs]",
            "invalid engine arguments: User-specified max_model_len (4096) is greater than",
        ),
        (
            "(EngineCore pid=9) RuntimeError: Engine core initialization failed.",
            "RuntimeError: Engine core initialization failed.",
        ),
    ],
)
def test_classify_failure(log_line: str, expected: str) -> None:
    text = 'INFO starting\nTraceback (most recent call last):\n  File "x.py", line 1\n' + log_line + "\n"
    reason = classify_failure(text)
    assert reason is not None and reason.startswith(expected), reason


def test_classify_failure_healthy_log() -> None:
    assert classify_failure("INFO starting\n" + KV_LINE + "\nINFO:     Application startup complete.\n") is None


# --------------------------------------------------------------------------- argv and environment


def _server(tmp_path: Path, **kw: object) -> VLLMServer:
    args: dict[str, object] = {
        "model": "/models/tiny",
        "served_name": "tiny",
        "config": EngineConfig(args=EngineArgs(max_model_len=512, max_num_seqs=4, enable_prefix_caching=False)),
        "log_path": tmp_path / "logs" / "server.log",
        "load_format": "dummy",
        "server_cpus": None,
    }
    args.update(kw)
    return VLLMServer(**args)  # type: ignore[arg-type]


def test_argv_is_a_list_in_a_fixed_order(tmp_path: Path) -> None:
    server = _server(tmp_path)
    argv = server.argv
    assert argv[:3] == [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    assert argv[3:11] == [
        "--model",
        "/models/tiny",
        "--served-model-name",
        "tiny",
        "--host",
        "127.0.0.1",
        "--port",
        str(server.port),
    ]
    assert argv[11:13] == ["--load-format", "dummy"]
    assert argv[-5:] == ["--max-num-seqs", "4", "--no-enable-prefix-caching", "--max-model-len", "512"]
    assert server.base_url == f"http://127.0.0.1:{server.port}"
    assert 0 < server.port < 65536


def test_argv_of_the_node_s_vllm_python_or_launch_and_no_load_format(tmp_path: Path) -> None:
    server = _server(tmp_path, command=vllm_command("/opt/vllm/bin/python"), load_format=None)
    assert server.argv[:3] == ["/opt/vllm/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert "--load-format" not in server.argv
    launch = ["srun", "--ntasks=1", "python", "-m", "vllm.entrypoints.openai.api_server"]
    server = _server(tmp_path, command=vllm_command("/ignored", launch))
    assert server.argv[: len(launch)] == launch
    assert server.argv[len(launch)] == "--model"


def test_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    monkeypatch.setenv("SERVETUNE_TEST_INHERITED", "yes")
    server = _server(tmp_path, server_cpus=[0])
    env = server.environment()
    assert env["SERVETUNE_TEST_INHERITED"] == "yes"
    assert env["VLLM_SERVER_DEV_MODE"] == "1"
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0"
    if is_cpu_node():
        assert env["VLLM_TARGET_DEVICE"] == "cpu"
        assert env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert "SERVETUNE_TEST_INHERITED" not in server.env_overrides
    assert server.env_overrides["VLLM_SERVER_DEV_MODE"] == "1"

    # the user's environment keeps its KV-cache size; the config's env overrides everything
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "3")
    config = EngineConfig(env={"VLLM_CPU_OMP_THREADS_BIND": "nobind", "SERVETUNE_TEST_INHERITED": "no"})
    server = _server(tmp_path, server_cpus=[0], config=config)
    env = server.environment()
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "3"
    assert "VLLM_CPU_KVCACHE_SPACE" not in server.env_overrides
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"
    assert env["SERVETUNE_TEST_INHERITED"] == "no"


def test_cpu_lists() -> None:
    assert cpu_list_string([0]) == "0"
    assert cpu_list_string([3, 0, 1, 2, 7, 9, 10]) == "0-3,7,9-10"
    assert omp_bind_value([0, 1, 2, 3], ranks=2) == "0-1|2-3"
    assert omp_bind_value([0, 1, 2], ranks=2) == "0-1|2"
    assert omp_bind_value([4, 5], ranks=1) == "4-5"


def test_bad_cpus_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="server_cpus"):
        _server(tmp_path, server_cpus=[])
    with pytest.raises(ValueError, match="server_cpus"):
        _server(tmp_path, server_cpus=[(os.cpu_count() or 1) + 5])


# --------------------------------------------------------------------------- process handling (no vLLM)


def _script_server(tmp_path: Path, code: str, **kw: object) -> VLLMServer:
    """A VLLMServer whose "server" is a small Python script (vLLM flags land in its sys.argv)."""
    return _server(tmp_path, command=[sys.executable, "-c", code], **kw)


def _running(pid: int) -> bool:
    """The process exists and is not a zombie (an orphan waits a moment for pid 1 to reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _wait_gone(pid: int, timeout_s: float = 10) -> bool:
    deadline = time.monotonic() + timeout_s
    while _running(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def test_cannot_execute(tmp_path: Path) -> None:
    server = _server(tmp_path, command=vllm_command(str(tmp_path / "no-such-python")))
    with pytest.raises(ServerStartError, match="cannot execute") as err:
        server.start(timeout_s=5)
    assert err.value.exit_code is None


def test_exit_during_start_carries_code_and_log(tmp_path: Path) -> None:
    code = (
        "import sys; print('loading'); print('ValueError: max_num_seqs must be positive', file=sys.stderr); sys.exit(3)"
    )
    server = _script_server(tmp_path, code)
    with pytest.raises(ServerStartError) as err:
        server.start(timeout_s=30)
    exc = err.value
    assert exc.exit_code == 3
    assert exc.reason == "exited with code 3: invalid engine arguments: max_num_seqs must be positive"
    assert "loading" in exc.log_tail and "max_num_seqs must be positive" in exc.log_tail
    assert "exited with code 3" in str(exc) and str(server.log_path) in str(exc)
    copy = pickle.loads(pickle.dumps(exc))  # crosses process boundaries intact
    assert (copy.reason, copy.exit_code, copy.log_tail) == (exc.reason, exc.exit_code, exc.log_tail)
    assert server.pgid is not None and not process_group_alive(server.pgid)


def test_deadline_kills_the_whole_group(tmp_path: Path) -> None:
    child_pid_file = tmp_path / "child.pid"
    code = (
        "import subprocess, sys, time\n"
        f"c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
        f"open({str(child_pid_file)!r}, 'w').write(str(c.pid))\n"
        "print('child started', flush=True)\n"
        "time.sleep(120)\n"
    )
    server = _script_server(tmp_path, code)
    started = time.monotonic()
    with pytest.raises(ServerStartError, match="not ready after 3 s") as err:
        server.start(timeout_s=3)
    assert time.monotonic() - started < 15
    assert err.value.exit_code == -signal.SIGTERM
    assert "child started" in err.value.log_tail
    child = int(child_pid_file.read_text())
    assert server.pgid is not None and not process_group_alive(server.pgid)
    assert _wait_gone(child, 1)


def test_stop_escalates_to_sigkill_and_is_idempotent(tmp_path: Path) -> None:
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(120)"
    server = _script_server(tmp_path, code)
    server.spawn()
    assert server.pgid == server.pid
    deadline = time.monotonic() + 10
    while "ready" not in server.log_tail() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.is_alive()
    assert server.stop(timeout_s=1) == -signal.SIGKILL
    assert server.stop() == -signal.SIGKILL
    assert server.pgid is not None and not process_group_alive(server.pgid)
    assert server.info().exit_code == -signal.SIGKILL


def test_server_is_pinned_to_its_cores(tmp_path: Path) -> None:
    core = max(os.sched_getaffinity(0))
    code = "import os, time; print('affinity', sorted(os.sched_getaffinity(0)), flush=True); time.sleep(60)"
    with _script_server(tmp_path, code, server_cpus=[core]) as server:
        server.spawn()
        deadline = time.monotonic() + 10
        while "affinity" not in server.log_tail() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert f"affinity [{core}]" in server.log_tail()
        assert server.info().cpus == [core]
    assert server.pgid is not None and not process_group_alive(server.pgid)


def test_server_dies_with_the_thread_that_started_it(tmp_path: Path) -> None:
    """PR_SET_PDEATHSIG fires when the forking *thread* exits: why servers start on a long-lived thread."""
    server = _script_server(tmp_path, "import time; time.sleep(60)")
    thread = threading.Thread(target=server.spawn)
    thread.start()
    thread.join(10)
    assert server.pid is not None
    deadline = time.monotonic() + 10
    while server.returncode is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.returncode == -signal.SIGTERM
    assert server.stop() == -signal.SIGTERM


def _run_to_exit(server: VLLMServer, timeout_s: float = 10) -> int | None:
    server.spawn()
    deadline = time.monotonic() + timeout_s
    while server.returncode is None and time.monotonic() < deadline:
        time.sleep(0.02)
    return server.stop(timeout_s=5)


def test_log_is_appended_per_run(tmp_path: Path) -> None:
    first = _script_server(tmp_path, "print('first run')")
    assert _run_to_exit(first) == 0
    second = _script_server(tmp_path, "print('second run')")
    assert _run_to_exit(second) == 0
    text = second.log_path.read_text()
    assert "first run" in text and "second run" in text
    assert "first run" not in second.log_tail()


# --------------------------------------------------------------------------- real vLLM


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate(tmp_path_factory.mktemp("models") / "tiny")


@pytest.mark.vllm
@needs_vllm
@pytest.mark.timeout(120)
def test_vllm_refuses_quickly(tiny_model: Path, tmp_path: Path) -> None:
    """max_model_len above the tiny model's 2048 positions: vLLM exits within seconds."""
    server = VLLMServer(
        model=str(tiny_model),
        served_name="tiny",
        config=EngineConfig(args=EngineArgs(max_model_len=4096)),
        log_path=tmp_path / "refused.log",
        load_format="dummy",
        server_cpus=None,
    )
    started = time.monotonic()
    with pytest.raises(ServerStartError) as err:
        server.start(timeout_s=90)
    elapsed = time.monotonic() - started
    exc = err.value
    assert exc.exit_code not in (None, 0)
    assert "exited with code" in exc.reason
    assert exc.classified is not None and "max_model_len (4096)" in exc.classified
    assert "max_model_len" in exc.log_tail
    assert server.pgid is not None and not process_group_alive(server.pgid)
    print(f"vLLM refused max_model_len=4096 after {elapsed:.1f} s: {exc.reason}")


@pytest.mark.vllm
@needs_vllm
def test_vllm_ready(vllm_server: VLLMServer) -> None:
    info = vllm_server.info()
    assert info.pid is not None and info.pgid == info.pid
    assert info.port == vllm_server.port
    assert info.startup_s is not None and info.startup_s > 0
    assert info.exit_code is None and vllm_server.is_alive()
    with urllib.request.urlopen(vllm_server.base_url + "/health", timeout=10) as resp:
        assert resp.status == 200
    argv = info.argv
    for flag, value in [
        ("--max-model-len", "512"),
        ("--max-num-seqs", "4"),
        ("--load-format", "dummy"),
        ("--served-model-name", "tiny"),
        ("--port", str(vllm_server.port)),
    ]:
        assert argv[argv.index(flag) + 1] == value
    print(f"vLLM ready after {info.startup_s:.1f} s; KV cache {info.kv_cache_tokens} tokens")


@pytest.mark.vllm
@needs_vllm
def test_vllm_kv_cache_capacity(vllm_server: VLLMServer) -> None:
    info = vllm_server.info()
    assert info.kv_cache_tokens is not None and info.kv_cache_tokens > 0
    assert info.reported_max_concurrency is not None and info.reported_max_concurrency > 0
    # vLLM says the same in /metrics: the log parse read the real number
    samples = vllm_server.scrape_samples()
    cache_info = [s for s in samples if s.name == "vllm:cache_config_info"]
    assert cache_info and int(cache_info[0].labels["kv_cache_size_tokens"]) == info.kv_cache_tokens


@pytest.mark.vllm
@needs_vllm
def test_vllm_pinned_and_bound(vllm_server: VLLMServer) -> None:
    assert vllm_server.pgid is not None
    members = group_members(vllm_server.pgid)
    assert len(members) >= 2  # API server + engine core (+ workers)
    for pid in members:
        status = Path(f"/proc/{pid}/status").read_text()
        allowed = [
            line.split(":", 1)[1].strip() for line in status.splitlines() if line.startswith("Cpus_allowed_list")
        ]
        assert allowed == ["0"], (pid, allowed)
    assert "VLLM_CPU_OMP_THREADS_BIND='0'" in vllm_server.log_tail(100000)


@pytest.mark.vllm
@needs_vllm
@pytest.mark.timeout(180)
def test_vllm_completion_moves_counters(vllm_server: VLLMServer) -> None:
    before = vllm_server.counters()
    assert set(before) >= {
        "request_success_total",
        "request_success_ok",
        "generation_tokens_total",
        "prompt_tokens_total",
        "num_preemptions_total",
        "prefix_cache_hits_total",
        "prefix_cache_queries_total",
    }
    body = json.dumps({"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 4, "ignore_eos": True}).encode()
    request = urllib.request.Request(
        vllm_server.base_url + "/v1/completions", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as resp:
        answer = json.loads(resp.read())
    assert answer["usage"]["completion_tokens"] == 4
    assert vllm_server.wait_idle(timeout_s=30)
    after = vllm_server.counters()
    delta = {k: after[k] - before[k] for k in before}
    assert delta["request_success_total"] == 1
    assert delta["request_success_ok"] == 1
    assert delta["generation_tokens_total"] == 4
    assert delta["prompt_tokens_total"] == 3
    gauges = vllm_server.gauges()
    assert gauges["num_requests_running"] == 0 and gauges["num_requests_waiting"] == 0


@pytest.mark.vllm
@needs_vllm
def test_vllm_reset_prefix_cache_and_idle(vllm_server: VLLMServer) -> None:
    assert vllm_server.reset_prefix_cache(timeout_s=30) is True
    assert vllm_server.wait_idle(timeout_s=30) is True
    metrics = vllm_server.scrape_metrics()
    assert "vllm:kv_cache_usage_perc" in metrics

# Stopping the shared server, and proving nothing of it is left, is the teardown of the
# session fixture ``vllm_server`` in tests/conftest.py.
