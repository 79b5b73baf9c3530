"""Processes on this node: CPU pinning, process groups, free ports, the child set-up of a server."""

from __future__ import annotations

import ctypes
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from functools import cache
from pathlib import Path

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


def cpu_list_string(cpus: list[int]) -> str:
    """A core list in the ``0-2,5`` form vLLM's ``VLLM_CPU_OMP_THREADS_BIND`` and taskset read."""
    ordered = sorted(set(cpus))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


def omp_bind_value(cpus: list[int], ranks: int = 1) -> str:
    """``VLLM_CPU_OMP_THREADS_BIND`` for ``cpus``: one list per tensor-parallel rank, ``|``-separated.

    With more ranks than cores (or a core count not divisible by ranks) the cores are split as
    evenly as possible; vLLM needs exactly one list per local rank.
    """
    ordered = sorted(set(cpus))
    if ranks <= 1 or len(ordered) < ranks:
        return cpu_list_string(ordered)
    size, extra = divmod(len(ordered), ranks)
    chunks: list[str] = []
    start = 0
    for rank in range(ranks):
        end = start + size + (1 if rank < extra else 0)
        chunks.append(cpu_list_string(ordered[start:end]))
        start = end
    return "|".join(chunks)


@cache
def is_cpu_node() -> bool:
    """True when this node has no NVIDIA GPU (no ``/dev/nvidia0``, and ``nvidia-smi -L`` lists none)."""
    if os.path.exists("/dev/nvidia0"):
        return False
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return True
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=15, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("nvidia-smi -L failed (%s); treating this node as CPU-only", exc)
        return True
    return not (out.returncode == 0 and "GPU " in out.stdout)


def process_group_alive(pgid: int) -> bool:
    """True while a live process is in process group ``pgid``.

    ``os.killpg(pgid, 0)`` answers for the group; where ``/proc`` exists, a group whose members
    are all zombies counts as gone (a container whose pid 1 does not reap orphans keeps them).
    """
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    states = _group_states(pgid)
    return states is None or any(state != "Z" for state in states)


def _group_states(pgid: int) -> list[str] | None:
    """Process states (``R``, ``S``, ``Z``...) of the members of ``pgid``; ``None`` without ``/proc``."""
    proc = Path("/proc")
    if not (proc / "self" / "stat").exists():
        return None
    states: list[str] = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and fields[2] == str(pgid):
            states.append(fields[0])
    return states


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS calls free on ``host`` now (bind to port 0). Another process may still take it
    before vLLM binds; that start then fails with "port already in use"."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _client_host(host: str) -> str:
    """Where a client on this node reaches a server bound to ``host``."""
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "::1"
    return host


def _child_setup(cpus: list[int] | None) -> Callable[[], None] | None:
    """The ``preexec_fn`` run in the forked child before it execs vLLM (Linux only).

    It does two syscalls and nothing else:

    - ``prctl(PR_SET_PDEATHSIG, SIGTERM)``: the server gets SIGTERM when its parent dies, so a
      crashed daemon leaves no vLLM behind. Caveat: the signal fires when the *thread* that
      forked the child exits, not the process. The daemon therefore starts servers from its
      long-lived worker thread; starting one from a short-lived thread would kill the server
      when that thread ends.
    - ``sched_setaffinity(0, cpus)``: pin the server (and everything it forks: engine core,
      workers) to its cores.

    Why ``preexec_fn`` and not ``taskset``/``setpriv`` in argv: the death signal needs code in
    the child anyway, and the argv stays exactly the vLLM command we record and export. Python
    warns that ``preexec_fn`` may deadlock in a threaded parent if the child needs a lock another
    thread held at fork time. We keep that risk out: libc's ``prctl`` is looked up here, in the
    parent, so the child neither imports nor dlopens; the child only calls two already-bound
    functions (glibc's fork handlers keep malloc usable in the child).
    """
    if not sys.platform.startswith("linux"):
        if cpus:
            log.warning("pinning a server to cores is only supported on Linux; ignoring cpus=%s", cpus)
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
        prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
        prctl.restype = ctypes.c_int
    except (OSError, AttributeError) as exc:  # pragma: no cover - every glibc/musl has prctl
        log.warning("prctl unavailable (%s): the server will not die with the daemon", exc)
        prctl = None
    parent = os.getpid()
    cpu_set = frozenset(cpus) if cpus else None
    sigterm = int(signal.SIGTERM)

    def setup() -> None:
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, sigterm, 0, 0, 0)
            if os.getppid() != parent:  # the parent died before prctl took effect
                os._exit(1)
        if cpu_set is not None:
            os.sched_setaffinity(0, cpu_set)

    return setup
