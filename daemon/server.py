"""Lifecycle of one vLLM OpenAI API server process on this node.

:class:`VLLMServer` builds the command line (a list, never a shell string) and the environment
from a typed :class:`~servetune.manifest.EngineConfig`, starts the server in its own process
group with its output appended to a log file, waits for ``GET /health`` under a deadline, reads
the KV-cache capacity vLLM reports at start-up, and reads ``/metrics``. :meth:`VLLMServer.stop`
ends the whole process group (API server, engine core, workers), so no vLLM outlives it.

A server that does not come up raises :class:`ServerStartError` with its exit code, the tail of
its log and a short classified reason (:func:`classify_failure`), which the daemon records as a
``measurement`` failure.

Threading: one thread drives a server (``start`` and the HTTP helpers); :meth:`VLLMServer.stop`
may be called from any thread and is idempotent. ``start`` must run on a thread that outlives
the server (see the ``PR_SET_PDEATHSIG`` note in :func:`_child_setup`).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, NoReturn

from daemon.endpoint import (
    COUNTER_METRICS,
    GAUGE_METRICS,
    Endpoint,
    ServerRequestError,
)
from daemon.procs import (
    _child_setup,
    _client_host,
    cpu_list_string,
    free_port,
    is_cpu_node,
    omp_bind_value,
    process_group_alive,
)
from daemon.serverlog import classify_failure, parse_kv_cache
from servetune.errors import ServetuneError
from servetune.manifest import EngineConfig
from servetune.result import ServerInfo

log = logging.getLogger(__name__)

API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
#: Lines of the server log carried by errors and results.
LOG_TAIL_LINES = 60
#: How much of the end of the log file is read to find the tail (the access log can be large).
_TAIL_READ_BYTES = 256 * 1024
#: How much of this run's log is read to find the start-up facts (KV-cache capacity).
_HEAD_READ_BYTES = 4 * 1024 * 1024
_HEALTH_REQUEST_TIMEOUT_S = 2.0
_HEALTH_POLL_S = 0.5

def vllm_command(python: str | None = None, launch: Sequence[str] | None = None) -> list[str]:
    """The command prefix that starts vLLM's OpenAI API server on this node, as its operator set it:
    ``launch`` (``daemon start --vllm-launch``, e.g. ``apptainer exec vllm.sif python3 -m
    vllm.entrypoints.openai.api_server``) wins, else ``python -m`` :data:`API_SERVER_MODULE` with
    ``python`` (``--vllm-python``) or this interpreter. Engine flags are appended to it."""
    if launch:
        return list(launch)
    return [python or sys.executable, "-m", API_SERVER_MODULE]


class ServerStartError(ServetuneError):
    """A vLLM server exited or was not ready before its deadline.

    Attributes:
        reason: short words for a person, e.g. ``"exited with code 1: invalid engine arguments: ..."``.
        exit_code: the server's exit status (negative: killed by that signal); ``None`` if unknown.
        log_tail: the last lines of this run's server log.
        log_path: where the whole log is.
        classified: what :func:`classify_failure` recognised in the log, if anything.
    """

    def __init__(
        self,
        reason: str,
        *,
        exit_code: int | None,
        log_tail: str,
        log_path: str | None = None,
        classified: str | None = None,
    ) -> None:
        self.reason = reason
        self.exit_code = exit_code
        self.log_tail = log_tail
        self.log_path = log_path
        self.classified = classified
        super().__init__(reason)

    def __reduce__(self) -> tuple[object, ...]:
        kwargs = {
            "exit_code": self.exit_code,
            "log_tail": self.log_tail,
            "log_path": self.log_path,
            "classified": self.classified,
        }
        return (_rebuild_start_error, (self.reason, kwargs))

    def __str__(self) -> str:
        head = f"vLLM server did not start: {self.reason}"
        if self.log_path:
            head += f" (log: {self.log_path})"
        tail = "\n".join(self.log_tail.splitlines()[-20:])
        return f"{head}\n--- last lines of the server log ---\n{tail}" if tail else head


def _rebuild_start_error(reason: str, kwargs: dict[str, Any]) -> ServerStartError:
    return ServerStartError(reason, **kwargs)


# --------------------------------------------------------------------------- the server


class VLLMServer(Endpoint):
    """One vLLM OpenAI API server process: argv, environment, start, metrics, stop.

    Args:
        model: what ``--model`` gets: a local folder or a hub id.
        served_name: ``--served-model-name``, the name clients put in requests.
        config: engine args (become flags) and server environment (overrides everything else).
        command: what starts the API server, before its flags: this node's operator's choice
            (:func:`vllm_command` of ``daemon start --vllm-python`` / ``--vllm-launch``), never
            something a GRANT said; ``None``: this interpreter, ``-m`` :data:`API_SERVER_MODULE`.
        log_path: the server's stdout and stderr are appended here (parents created).
        load_format: ``--load-format`` (``dummy`` for random weights), or ``None`` for vLLM's default.
        server_cpus: cores to pin the server to (also its OpenMP binding); ``None``: no pinning,
            the server inherits the caller's affinity (so a daemon that pinned itself to a
            reserved core must pass the server's cores).
        host: interface the server binds; clients on this node use :attr:`base_url`.
        access_log: keep uvicorn's one-line-per-request access log (off by default: under load it
            costs CPU next to the measurement and grows the log).

    The port is chosen when the object is made, so :attr:`argv` is complete before :meth:`start`.
    """

    def __init__(
        self,
        *,
        model: str,
        served_name: str,
        config: EngineConfig,
        log_path: Path,
        load_format: str | None,
        server_cpus: list[int] | None,
        command: Sequence[str] | None = None,
        host: str = "127.0.0.1",
        access_log: bool = False,
    ) -> None:
        self.model = model
        self.served_name = served_name
        self.config = config
        self.command = list(command) if command else vllm_command()
        self.log_path = Path(log_path)
        self.load_format = load_format
        self.host = host
        self.access_log = access_log
        self.server_cpus = self._check_cpus(server_cpus)
        self.port = free_port(host)
        client_host = _client_host(host)
        self.configure_endpoint(
            f"http://[{client_host}]:{self.port}" if ":" in client_host else f"http://{client_host}:{self.port}"
        )
        self._argv = self._build_argv()
        self._env_overrides = self._build_env_overrides()
        self._proc: subprocess.Popen[bytes] | None = None
        self._pgid: int | None = None
        self._log_offset = 0
        self._started_at: float | None = None
        self._startup_s: float | None = None
        self._kv_cache_tokens: int | None = None
        self._max_concurrency: float | None = None
        self._exit_code: int | None = None
        self._stop_lock = threading.Lock()

    # ------------------------------------------------------------------ construction

    @staticmethod
    def _check_cpus(cpus: list[int] | None) -> list[int] | None:
        if cpus is None:
            return None
        ordered = sorted(set(cpus))
        count = os.cpu_count() or 1
        bad = [c for c in ordered if not 0 <= c < count]
        if not ordered or bad:
            raise ValueError(f"server_cpus must be a non-empty list of cores in 0..{count - 1}, got {cpus!r}")
        return ordered

    def _build_argv(self) -> list[str]:
        argv = list(self.command)
        argv += ["--model", self.model, "--served-model-name", self.served_name]
        argv += ["--host", self.host, "--port", str(self.port)]
        if self.load_format is not None:
            argv += ["--load-format", self.load_format]
        if not self.access_log:
            argv.append("--disable-uvicorn-access-log")
        argv += self.config.args.cli_args()
        return argv

    def _build_env_overrides(self) -> dict[str, str]:
        ours: dict[str, str] = {}
        cpu = is_cpu_node()
        if cpu:
            # Without it some entry points pick AVX-512 kernels and die with SIGILL on AVX2 CPUs.
            ours["VLLM_TARGET_DEVICE"] = "cpu"
        ours["VLLM_SERVER_DEV_MODE"] = "1"  # enables POST /reset_prefix_cache
        if self.server_cpus:
            ranks = self.config.args.tensor_parallel_size or 1
            ours["VLLM_CPU_OMP_THREADS_BIND"] = omp_bind_value(self.server_cpus, ranks)
        if cpu and "VLLM_CPU_KVCACHE_SPACE" not in os.environ and "VLLM_CPU_KVCACHE_SPACE" not in self.config.env:
            # Unset, recent vLLM takes up to half the RAM per server.
            ours["VLLM_CPU_KVCACHE_SPACE"] = "1"
        if "PYTHONUNBUFFERED" not in os.environ:
            ours["PYTHONUNBUFFERED"] = "1"  # the log tail must hold the last words of a crash
        ours.update(self.config.env)
        return ours

    @property
    def argv(self) -> list[str]:
        """The server's command line (a copy)."""
        return list(self._argv)

    @property
    def env_overrides(self) -> dict[str, str]:
        """The environment variables this object sets on top of ``os.environ`` (config env included)."""
        return dict(self._env_overrides)

    def environment(self) -> dict[str, str]:
        """The server's whole environment: ``os.environ``, then our settings, then the config's env."""
        env = dict(os.environ)
        env.update(self._env_overrides)
        return env

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def pgid(self) -> int | None:
        return self._pgid

    @property
    def returncode(self) -> int | None:
        """The exit status once the server process has exited (negative: killed by a signal)."""
        if self._proc is None:
            return None
        code = self._proc.poll()
        if code is not None:
            self._exit_code = code
        return code

    def is_alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def info(self) -> ServerInfo:
        """What a result records about this server."""
        return ServerInfo(
            argv=self.argv,
            pid=self.pid,
            pgid=self._pgid,
            port=self.port,
            startup_s=self._startup_s,
            kv_cache_tokens=self._kv_cache_tokens,
            reported_max_concurrency=self._max_concurrency,
            log_path=str(self.log_path),
            exit_code=self.returncode if self._exit_code is None else self._exit_code,
            cpus=list(self.server_cpus or []),
        )

    # ------------------------------------------------------------------ lifecycle

    def spawn(self) -> None:
        """Start the process and return at once (see :meth:`start` to also wait until ready)."""
        if self._proc is not None:
            raise RuntimeError("this VLLMServer was already started; make a new one")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as logf:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
            header = f"=== servetune {stamp}: starting vLLM server: {' '.join(self._argv)}\n"
            header += f"=== env overrides: {json.dumps(self._env_overrides, sort_keys=True)}\n"
            logf.write(header.encode("utf-8", "replace"))
            logf.flush()
            self._log_offset = logf.tell()
            log.info("starting vLLM server on port %d (log %s): %s", self.port, self.log_path, " ".join(self._argv))
            self._started_at = time.monotonic()
            try:
                self._proc = subprocess.Popen(
                    self._argv,
                    stdin=subprocess.DEVNULL,
                    stdout=logf,
                    stderr=subprocess.STDOUT,
                    env=self.environment(),
                    start_new_session=True,
                    preexec_fn=_child_setup(self.server_cpus),
                    close_fds=True,
                )
            except (OSError, subprocess.SubprocessError) as exc:
                reason = f"cannot execute {self._argv[0]!r}: {exc}"
                logf.write(f"=== servetune: {reason}\n".encode("utf-8", "replace"))
                raise ServerStartError(reason, exit_code=None, log_tail="", log_path=str(self.log_path)) from exc
        # start_new_session makes the child the leader of a new process group: pgid == pid.
        self._pgid = self._proc.pid

    def start(self, timeout_s: float) -> ServerInfo:
        """Start the server and wait until ``GET /health`` answers 200.

        Returns:
            The :class:`~servetune.result.ServerInfo`, with the start-up time and the KV-cache
            capacity vLLM reported.

        Raises:
            ServerStartError: the server exited, or was not ready within ``timeout_s`` (then its
                process group has been killed). Either way no process of it is left.
        """
        self.spawn()
        assert self._proc is not None and self._started_at is not None
        try:
            self._wait_ready(self._proc, self._started_at + timeout_s, timeout_s)
        except ServerStartError:
            raise
        except BaseException:  # KeyboardInterrupt, a bug: never leave the server behind
            self.stop(timeout_s=10)
            raise
        self._startup_s = time.monotonic() - self._started_at
        self._kv_cache_tokens, self._max_concurrency = parse_kv_cache(self._read_log(_HEAD_READ_BYTES, from_end=False))
        log.info(
            "vLLM server pid %d ready on port %d after %.1f s (KV cache %s tokens, max concurrency %s)",
            self._proc.pid,
            self.port,
            self._startup_s,
            self._kv_cache_tokens,
            self._max_concurrency,
        )
        return self.info()

    def _wait_ready(self, proc: subprocess.Popen[bytes], deadline: float, timeout_s: float) -> None:
        while True:
            code = proc.poll()
            if code is not None:
                self._fail(f"exited with code {code}", code)
            if self._health(min(_HEALTH_REQUEST_TIMEOUT_S, max(0.1, deadline - time.monotonic()))):
                return
            if time.monotonic() >= deadline:
                self._fail(f"not ready after {timeout_s:g} s", None)
            time.sleep(min(_HEALTH_POLL_S, max(0.0, deadline - time.monotonic())))

    def _fail(self, what: str, exit_code: int | None) -> NoReturn:
        """Kill what is left of the server, then raise :class:`ServerStartError`."""
        self.stop(timeout_s=10)
        if exit_code is None:
            exit_code = self._exit_code
        tail = self.log_tail(LOG_TAIL_LINES)
        classified = classify_failure(self._read_log(_TAIL_READ_BYTES, from_end=True))
        reason = f"{what}: {classified}" if classified else what
        log.warning("vLLM server failed to start: %s (log %s)", reason, self.log_path)
        raise ServerStartError(
            reason, exit_code=exit_code, log_tail=tail, log_path=str(self.log_path), classified=classified
        )

    def stop(self, timeout_s: float = 20) -> int | None:
        """End the server's whole process group: SIGTERM, wait up to ``timeout_s``, then SIGKILL.

        Idempotent and safe from any thread. Returns the exit code (``None`` if never started).
        """
        with self._stop_lock:
            proc, pgid = self._proc, self._pgid
            if proc is None or pgid is None:
                return None
            if proc.poll() is not None and not process_group_alive(pgid):
                self._exit_code = proc.returncode
                return self._exit_code
            log.info("stopping vLLM server pid %d (process group %d)", proc.pid, pgid)
            self._signal_group(pgid, signal.SIGTERM)
            if not self._wait_group_gone(proc, pgid, timeout_s):
                log.warning("vLLM server group %d still alive %g s after SIGTERM; sending SIGKILL", pgid, timeout_s)
                self._signal_group(pgid, signal.SIGKILL)
                if not self._wait_group_gone(proc, pgid, 10.0):
                    log.error("vLLM server process group %d survived SIGKILL for 10 s", pgid)
            try:
                self._exit_code = proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                log.error("vLLM server pid %d could not be reaped", proc.pid)
            return self._exit_code

    @staticmethod
    def _signal_group(pgid: int, sig: signal.Signals) -> None:
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            pass

    @staticmethod
    def _wait_group_gone(proc: subprocess.Popen[bytes], pgid: int, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while True:
            proc.poll()  # reap the leader, or its zombie keeps the group "alive"
            if not process_group_alive(pgid):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)

    def __enter__(self) -> VLLMServer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # ------------------------------------------------------------------ log

    def _read_log(self, limit: int, *, from_end: bool) -> str:
        """Up to ``limit`` bytes of this run's part of the log, from its start or its end."""
        try:
            with open(self.log_path, "rb") as f:
                size = f.seek(0, os.SEEK_END)
                start = max(self._log_offset, size - limit) if from_end else self._log_offset
                f.seek(start)
                data = f.read(limit)
        except OSError as exc:
            log.warning("cannot read server log %s: %s", self.log_path, exc)
            return ""
        return data.decode("utf-8", "replace")

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last ``lines`` lines this run wrote to the log."""
        text = self._read_log(_TAIL_READ_BYTES, from_end=True)
        return "\n".join(text.splitlines()[-lines:])


__all__ = [
    "COUNTER_METRICS",
    "GAUGE_METRICS",
    "ServerRequestError",
    "ServerStartError",
    "VLLMServer",
    "classify_failure",
    "cpu_list_string",
    "free_port",
    "is_cpu_node",
    "omp_bind_value",
    "parse_kv_cache",
    "process_group_alive",
]
