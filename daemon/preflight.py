"""Preflight: is this node fit to measure, before it joins and before each batch?

:func:`run_preflight` runs each check and returns a :class:`PreflightResult` (ok, or failed with
one reason per failed check). The checks:

- ``gpus_idle``: the GPUs the batch will use run no compute process but this daemon's own and have
  at most ``max_used_fraction`` of their memory in use (another tenant's load would be measured
  too). Read through NVML; a CPU-only node has nothing to check; a node whose NVML does not answer
  while ``nvidia-smi`` saw GPUs fails (their use cannot be known).
- ``vllm``: for a ``vllm`` batch, vLLM is installed in the interpreter that runs it at the expected
  version (``--expect-vllm-version``, else the version this daemon advertised when it joined), and
  really imports. The version is re-read before every batch. The import (a child process with a
  deadline, 5-20 s) is proven once per interpreter and version: before a batch it is deferred to
  the server start, which imports vLLM anyway; only when that start fails is ``import vllm`` run on
  its own (:meth:`VllmCheck.after_failed_start`), so a broken vLLM is still a daemon error and never
  a measurement failure of the config. A re-check of a daemon out of service imports at once. A
  failed import is not remembered: a repaired vLLM passes the next check. With ``--vllm-launch``
  the launch command's environment is the operator's: skipped, and it says so.
- ``model``: for a ``vllm`` batch, the model is on this node: a ``path`` model's folder has a
  ``config.json``, a hub model is in the Hugging Face cache (``HF_HUB_CACHE``, else
  ``HF_HOME/hub``, else ``~/.cache/huggingface/hub``), with the asked revision if one is named.
- ``disk``: the daemon's workdir (logs, spool) has at least ``min_free_disk_bytes`` free.

A failed preflight takes the daemon out of service (:mod:`daemon.agent`): it asks for no work until
a re-check passes, says why in its log and to the coordinator (HELLO's ``out_of_service``; a
granted batch it cannot take is answered with a BATCH_ERROR, a daemon error that the coordinator
re-queues). It is never a result, so never a measurement failure of a config.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from daemon.fingerprint import package_versions
from daemon.gpusets import GPUSet, batch_gpu_set
from daemon.nvml import read_use, with_nvml
from servetune.errors import ServetuneError
from servetune.result import Fingerprint
from servetune.spec import ModelSpec

if TYPE_CHECKING:
    from servetune.messages import Grant

log = logging.getLogger(__name__)

CheckStatus = Literal["ok", "failed", "skipped"]
DEFAULT_MIN_FREE_DISK_BYTES = 1024**3
DEFAULT_MAX_USED_FRACTION = 0.05
VLLM_IMPORT_TIMEOUT_S = 180.0


@dataclass(frozen=True)
class Check:
    name: str
    status: CheckStatus
    detail: str

    def as_dict(self) -> dict[str, str]:
        return {"name": self.name, "status": self.status, "detail": self.detail}


@dataclass(frozen=True)
class PreflightResult:
    checks: tuple[Check, ...]

    @property
    def ok(self) -> bool:
        return all(c.status != "failed" for c in self.checks)

    @property
    def reasons(self) -> list[str]:
        return [f"{c.name}: {c.detail}" for c in self.checks if c.status == "failed"]

    @property
    def summary(self) -> str:
        return "preflight ok" if self.ok else "preflight failed: " + "; ".join(self.reasons)

    def as_dict(self) -> dict[str, object]:
        return {"ok": self.ok, "summary": self.summary, "checks": [c.as_dict() for c in self.checks]}


# ----------------------------------------------------------------------------- the checks


def check_gpus_idle(gpus: Iterable[int] | None, own_pids: Iterable[int] = (), expect_gpus: bool = False,
                    max_used_fraction: float = DEFAULT_MAX_USED_FRACTION, shared: Iterable[int] = ()) -> Check:
    """The GPUs ``gpus`` (None: all) run no foreign compute process and have their memory free.
    ``shared``: GPUs of the set that another batch of this daemon uses under declared co-tenancy
    (``daemon start --co-tenancy``): busy by declaration, so not checked (the text says so).

    ``expect_gpus``: the node has GPUs (seen some other way, e.g. nvidia-smi), so NVML not
    answering is a failure rather than a CPU-only node."""
    mine = set(own_pids)
    try:
        found, status = with_nvml(read_use)
    except Exception as exc:
        return Check("gpus_idle", "failed", f"reading GPU use through NVML failed: {exc}")
    if found is None:
        if expect_gpus or status.hung:
            return Check("gpus_idle", "failed", f"this node has GPUs but NVML does not answer ({status.reason}): "
                                                "whether they are idle cannot be known")
        return Check("gpus_idle", "skipped", f"no GPU to check ({status.reason})")
    uses = found
    if not uses:
        return Check("gpus_idle", "skipped", "no GPU on this node (NVML reports none)")
    co_tenanted = set(shared)
    wanted = None if gpus is None else set(gpus) - co_tenanted
    note = (f"; GPU(s) {','.join(map(str, sorted(co_tenanted)))} not checked: shared with this daemon's other "
            "batch(es) under declared co-tenancy") if co_tenanted else ""
    if wanted is not None and not wanted and co_tenanted:
        return Check("gpus_idle", "skipped", note.removeprefix("; "))
    missing = sorted(wanted - {u.index for u in uses}) if wanted is not None else []
    problems = [f"GPU {i} does not exist on this node" for i in missing]
    for use in uses:
        if wanted is not None and use.index not in wanted:
            continue
        foreign = [p for p in use.processes if p.pid not in mine]
        if foreign:
            procs = ", ".join(f"pid {p.pid}" + (f" ({p.used_mib} MiB)" if p.used_mib is not None else "")
                              for p in foreign)
            problems.append(f"GPU {use.index} runs another compute process: {procs}")
        if use.memory_total_mib and use.memory_used_mib > max_used_fraction * use.memory_total_mib:
            problems.append(f"GPU {use.index} has {use.memory_used_mib} of {use.memory_total_mib} MiB in use "
                            f"(more than {max_used_fraction:.0%})")
    checked = sorted(u.index for u in uses if wanted is None or u.index in wanted)
    if problems:
        return Check("gpus_idle", "failed", "; ".join(problems) + note)
    return Check("gpus_idle", "ok", f"GPU(s) {','.join(map(str, checked))} idle{note}")


def check_disk(path: Path, min_free_bytes: int = DEFAULT_MIN_FREE_DISK_BYTES) -> Check:
    """``path`` (created if missing) has at least ``min_free_bytes`` free."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(path).free
    except OSError as exc:
        return Check("disk", "failed", f"{path}: cannot be created or read: {exc.strerror or exc}")
    gib = 1024**3
    if free < min_free_bytes:
        return Check("disk", "failed", f"{path} has {free / gib:.2f} GiB free, less than the "
                                       f"{min_free_bytes / gib:.2f} GiB needed for logs")
    return Check("disk", "ok", f"{path}: {free / gib:.1f} GiB free")


def hf_hub_cache(environ: dict[str, str] | None = None) -> Path:
    """The Hugging Face hub cache folder, as huggingface_hub resolves it."""
    env = os.environ if environ is None else environ
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "hub"
    return Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "huggingface" / "hub"


def check_model(model: ModelSpec, hub_cache: Path | None = None) -> Check:
    """The model is on this node (tiny models are generated on demand)."""
    if model.source == "tiny":
        return Check("model", "ok", "tiny model (generated on this node)")
    if model.source == "path":
        cfg = Path(model.path or "") / "config.json"
        if cfg.is_file():
            return Check("model", "ok", f"{model.path} present")
        return Check("model", "failed", f"model path {model.path} has no config.json on this node")
    cache = hub_cache or hf_hub_cache()
    folder = cache / ("models--" + (model.id or "").replace("/", "--"))
    snapshots = folder / "snapshots"
    if not snapshots.is_dir() or not any(snapshots.iterdir()):
        return Check("model", "failed", f"hub model {model.id!r} is not in the Hugging Face cache {cache} on this node")
    if model.revision:
        ref = folder / "refs" / model.revision
        commit = ref.read_text(encoding="utf-8").strip() if ref.is_file() else model.revision
        if not (snapshots / commit).is_dir():
            return Check("model", "failed", f"hub model {model.id!r} revision {model.revision!r} is not in the "
                                            f"Hugging Face cache {cache} on this node")
    return Check("model", "ok", f"hub model {model.id!r} in {cache}")


_IMPORT_SCRIPT = "import vllm, sys; sys.stdout.write(str(getattr(vllm, '__version__', '')))"


@dataclass
class VllmCheck:
    """vLLM's version (package metadata, every time) and a real import (proven once per interpreter
    and version: importing vLLM takes 5-20 s; before a batch the server start is the proof, see the
    module docstring)."""

    python: str | None = None
    launch: list[str] | None = None
    #: the operator's ``--expect-vllm-version`` (also checked at join when set)
    expected: str | None = None
    #: the version the daemon advertised when it joined: expected before each batch when no other was set
    advertised: str | None = None
    import_timeout_s: float = VLLM_IMPORT_TIMEOUT_S
    #: (interpreter, version) pairs whose import is proven: by ``import vllm`` or by a server that started
    _proven: set[tuple[str, str]] = field(default_factory=set)

    def __call__(self, *, defer_import: bool = False) -> Check:
        """The check. ``defer_import``: a pair not yet proven passes on its version alone; the batch's
        server start proves the import (:meth:`started`) or :meth:`after_failed_start` checks it."""
        if self.launch:
            return Check("vllm", "skipped", f"vLLM starts through --vllm-launch {self.launch[0]!r}: its environment "
                                            "is the operator's, not checked here")
        python = self.python or sys.executable
        version = package_versions(self.python)["vllm"]
        if version is None:
            return Check("vllm", "failed", f"vLLM is not installed for {python}")
        expected = self.expected or self.advertised
        if expected and version != expected:
            why = "--expect-vllm-version" if self.expected else "the version this daemon advertised when it joined"
            return Check("vllm", "failed", f"vLLM {version} is installed for {python}; expected {expected} ({why})")
        if (python, version) in self._proven:
            return Check("vllm", "ok", f"vLLM {version} imports in {python}")
        if defer_import:
            return Check("vllm", "ok", f"vLLM {version} is installed for {python} (its import is checked by the "
                                       "server start)")
        return self._proved(python, version) or Check("vllm", "ok", f"vLLM {version} imports in {python}")

    def _key(self) -> tuple[str, str] | None:
        """(interpreter, installed version) of this node's vLLM, None with --vllm-launch or none installed.
        Stateless, so batches running side by side share one check safely."""
        if self.launch:
            return None
        version = package_versions(self.python)["vllm"]
        return None if version is None else (self.python or sys.executable, version)

    def _proved(self, python: str, version: str) -> Check | None:
        """``import vllm`` now: the failed check, or None (and the pair is proven)."""
        problem = self._import(python)
        if problem:
            return Check("vllm", "failed", problem)
        self._proven.add((python, version))
        return None

    def started(self) -> None:
        """A batch's server started: its vLLM imports."""
        key = self._key()
        if key is not None:
            self._proven.add(key)

    def after_failed_start(self) -> Check | None:
        """A batch's server did not start: the failed check if ``import vllm`` fails on its own (a
        daemon error, not the config's), else None (the config's failure). Imports only a pair not
        yet proven, so a config that cannot start costs no import after the first."""
        key = self._key()
        if key is None or key in self._proven:
            return None
        return self._proved(*key)

    def _import(self, python: str) -> str:
        env = dict(os.environ)
        if shutil.which("nvidia-smi") is None:  # as daemon.server: CPU kernels, or SIGILL on AVX2-only CPUs
            env.setdefault("VLLM_TARGET_DEVICE", "cpu")
        try:
            out = subprocess.run([python, "-c", _IMPORT_SCRIPT], capture_output=True, text=True,
                                 timeout=self.import_timeout_s, check=False, env=env)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"`import vllm` in {python} did not finish: {exc}"
        if out.returncode != 0:
            tail = out.stderr.strip().splitlines()[-1:] or [""]
            return f"`import vllm` in {python} failed (exit code {out.returncode}): {tail[0][:300]}"
        return ""


# ----------------------------------------------------------------------------- the whole run


@dataclass
class Preflight:
    """This node's preflight settings; call :meth:`run` at join (no grant) and before each batch."""

    workdir: Path
    vllm: VllmCheck = field(default_factory=VllmCheck)
    min_free_disk_bytes: int = DEFAULT_MIN_FREE_DISK_BYTES
    max_used_fraction: float = DEFAULT_MAX_USED_FRACTION
    node_has_gpus: bool = False
    hub_cache: Path | None = None

    def run(self, backend: str | None = None, model: ModelSpec | None = None, gpus: Iterable[int] | None = None,
            own_pids: Iterable[int] = (), shared: Iterable[int] = (), *,
            defer_vllm_import: bool = False) -> PreflightResult:
        """``backend``/``model``: the batch's (None at join: only the node-wide checks run, vLLM only
        when an expected version was set). ``gpus``: the batch's GPU set (None: all).
        ``defer_vllm_import``: leave vLLM's import to the server start (:class:`VllmCheck`)."""
        checks = [check_disk(self.workdir, self.min_free_disk_bytes)]
        if backend in (None, "vllm"):
            checks.append(check_gpus_idle(gpus, own_pids, self.node_has_gpus, self.max_used_fraction, shared))
        if backend == "vllm" or (backend is None and self.vllm.expected):
            checks.append(self.vllm(defer_import=defer_vllm_import and backend == "vllm"))
        if backend == "vllm" and model is not None:
            checks.append(check_model(model, self.hub_cache))
        result = PreflightResult(tuple(checks))
        log.log(logging.INFO if result.ok else logging.ERROR, "%s", result.summary)
        return result


class PreflightFailed(ServetuneError):
    """A batch's preflight failed: the daemon answers its GRANT with a BATCH_ERROR (a daemon error,
    re-queued by the coordinator, never a result) and goes out of service."""

    def __init__(self, result: PreflightResult):
        super().__init__(result.summary)
        self.result = result


def batch_preflight(preflight: Preflight, grant: Grant, fingerprint: Fingerprint,
                    chosen: GPUSet | None = None, shared: Iterable[int] = (), *,
                    defer_vllm_import: bool = False) -> PreflightResult:
    """The preflight of ``grant`` on this node: its backend, its model, the GPU set it will get
    (``chosen``, as the daemon's slots gave it; None: the best set of its tensor_parallel_size,
    which is None too on a CPU-only node or when the node has too few GPUs). ``defer_vllm_import``:
    as :meth:`Preflight.run` (the batch runner defers; a re-check out of service does not)."""
    if chosen is None:
        chosen = batch_gpu_set(fingerprint, grant.config.args.tensor_parallel_size)
    return preflight.run(grant.backend.kind, grant.model, chosen.gpus if chosen is not None else None,
                         own_pids=[os.getpid()], shared=shared, defer_vllm_import=defer_vllm_import)
