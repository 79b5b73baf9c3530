"""Ask the vLLM this daemon runs which engine flags it accepts, once per vLLM version (cached on disk).

:class:`EngineArgsProbe` answers :meth:`~EngineArgsProbe.read` with an
:class:`~servetune.vllm_args.AcceptedArgs` (reported in HELLO, checked by the coordinator before it
grants a ``vllm`` batch) or None, with a warning saying why, when it cannot ask.

How it asks, in a child process with a deadline (:data:`PROBE_TIMEOUT_S`):

1. the interpreter that runs vLLM (``--vllm-python``, else this one) builds vLLM's own API-server
   parser (``make_arg_parser`` on a ``FlexibleArgumentParser``, the parser ``vllm serve`` and
   ``python -m vllm.entrypoints.openai.api_server`` parse with; ``AsyncEngineArgs.add_cli_args`` on
   vLLM versions without it) and lists every long option string of its actions;
2. else (that import failed: another module layout; or the node starts vLLM through
   ``--vllm-launch``, whose environment only the launch command reaches) the very command the
   daemon starts vLLM with, plus ``--help=all``, and the long options its help names.

Importing the parser costs 12-20 s (torch, transformers, vLLM's config modules), so the answer is
kept in a JSON file under ``$SERVETUNE_HOME/vllm-args/`` (``--engine-args-cache``), keyed by the
vLLM version (package metadata, read without importing vLLM) and the command (interpreter path or
launch command): the cost is paid once per vLLM version and interpreter, and a later start reads the
file in milliseconds. A vLLM whose version is unknown (a ``--vllm-launch`` into an image this
daemon cannot see into) is keyed by its command alone: after changing the image under the same
command, delete the cache folder. A file that cannot be read or does not match its key is
recomputed; writes are atomic (temporary file, then rename).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from daemon.server import vllm_command
from servetune.canonical import canonical_json, sha256_json
from servetune.keys import servetune_home
from servetune.vllm_args import FLAG_MAX_CHARS, FLAG_PATTERN, MAX_FLAGS, AcceptedArgs, cache_dir

log = logging.getLogger(__name__)

#: How long one child (the parser import, or ``--help=all``) may take (measured: 12-20 s on 2 cores).
PROBE_TIMEOUT_S = 180.0
#: How long a child killed at its deadline may take to be reaped.
KILL_WAIT_S = 10.0
#: The largest cache file read (one holds about 10 KB).
MAX_CACHE_BYTES = 1024 * 1024
#: The cache file format (a change makes old files miss, never misread).
CACHE_FORMAT = 1
_MARK = "SERVETUNE-ACCEPTED-ARGS "
_HELP_SOURCE = "--help=all"

# Run in the vLLM interpreter: vLLM's own parser, as its API server builds it; its long options.
_PROBE_SCRIPT = f"""
import importlib, json, sys
parser_cls = None
for name in ("vllm.utils.argparse_utils", "vllm.utils"):
    try:
        parser_cls = importlib.import_module(name).FlexibleArgumentParser
        break
    except (ImportError, AttributeError):
        pass
if parser_cls is None:
    sys.exit("vLLM has no FlexibleArgumentParser where servetune looks for it")
parser = source = None
for name in ("vllm.entrypoints.launchers.cli_args", "vllm.entrypoints.openai.cli_args"):
    try:
        make = importlib.import_module(name).make_arg_parser
    except (ImportError, AttributeError):
        continue
    parser, source = make(parser_cls()), name + ".make_arg_parser"
    break
if parser is None:
    from vllm.engine.arg_utils import AsyncEngineArgs
    parser, source = AsyncEngineArgs.add_cli_args(parser_cls()), "vllm.engine.arg_utils.AsyncEngineArgs.add_cli_args"
flags = sorted({{s for a in parser._actions for s in a.option_strings if s.startswith("--")}})
try:
    import vllm
    version = str(getattr(vllm, "__version__", "") or "")
except Exception:
    version = ""
sys.stdout.write("\\n{_MARK}" + json.dumps({{"source": source, "flags": flags, "version": version}}) + "\\n")
"""

_FLAG_RE = re.compile(FLAG_PATTERN)
#: A long option where ``--help`` output names one: after a space, a comma, ``[`` or a line start.
_HELP_FLAG_RE = re.compile(r"(?:^|[\s,\[(])(--[A-Za-z0-9][A-Za-z0-9._-]*)")


def flags_from_help(text: str) -> list[str]:
    """The long options named in argparse ``--help`` output (sorted, each once). Option names
    only: a ``--flag`` quoted inside a description is counted too, which can only make the check
    more lenient, never refuse a config vLLM would take."""
    return sorted({m.group(1).rstrip(".") for m in _HELP_FLAG_RE.finditer(text)})


class ProbeFailed(Exception):
    """The child could not say which flags vLLM accepts (the message says why)."""


@dataclass
class EngineArgsProbe:
    """Reads (and caches) the flags of this node's vLLM. ``python``/``launch``: as the daemon starts
    vLLM (``--vllm-python`` / ``--vllm-launch``); ``cache``: the cache folder (None: under
    ``$SERVETUNE_HOME``); ``timeout_s``: the deadline of each child process."""

    python: str | None = None
    launch: list[str] | None = None
    cache: Path | None = None
    timeout_s: float = PROBE_TIMEOUT_S

    @property
    def folder(self) -> Path:
        return self.cache if self.cache is not None else cache_dir(servetune_home())

    def key(self, version: str | None) -> dict[str, object]:
        """What a cached answer is for: the format, the vLLM version, and the command that runs vLLM."""
        command = list(self.launch) if self.launch else [os.path.abspath(shutil.which(self.python or sys.executable)
                                                                         or self.python or sys.executable)]
        return {"format": CACHE_FORMAT, "vllm_version": version, "command": command}

    def path(self, version: str | None) -> Path:
        return self.folder / f"{sha256_json(self.key(version))[:32]}.json"

    def read(self, version: str | None) -> AcceptedArgs | None:
        """The flags this node's vLLM (``version``, as its package metadata says; None: unknown)
        accepts: from the cache, else asked (12-20 s) and cached. None, with a warning, when
        vLLM cannot be asked: then the coordinator does not check this daemon's configs."""
        if version is None and not self.launch:
            log.warning("no vLLM installed for %s: engine args are not checked before they run", self.python
                        or sys.executable)
            return None
        cached = self._load(version)
        if cached is not None:
            log.info("vLLM %s accepts %d long options (cached in %s)", cached.vllm_version, len(cached.flags),
                     self.path(version))
            return cached
        log.info("asking vLLM %s which engine args it accepts (once per vLLM version: 12-20 s)", version or "")
        t0 = time.monotonic()
        try:
            accepted = self._ask(version)
        except ProbeFailed as exc:
            log.warning("cannot read which engine args vLLM %s accepts: %s; the coordinator will not check "
                        "configs against it before they run", version or "(unknown version)", exc)
            return None
        took = time.monotonic() - t0
        log.info("vLLM %s accepts %d long options (read through %s in %.1f s)", accepted.vllm_version,
                 len(accepted.flags), accepted.source, took)
        self._store(version, accepted, took)
        return accepted

    # ------------------------------------------------------------------ cache

    def _load(self, version: str | None) -> AcceptedArgs | None:
        path = self.path(version)
        try:
            with open(path, "rb") as fh:
                raw = fh.read(MAX_CACHE_BYTES + 1)
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.warning("cannot read %s (%s): asking vLLM again", path, exc)
            return None
        try:
            if len(raw) > MAX_CACHE_BYTES:
                raise ValueError(f"over {MAX_CACHE_BYTES} bytes")
            data = json.loads(raw)
            if not isinstance(data, dict) or canonical_json(data.get("key")) != canonical_json(self.key(version)):
                raise ValueError("its key is not this vLLM's")
            return AcceptedArgs.model_validate(data.get("accepted"))
        except (ValueError, ValidationError) as exc:
            log.warning("ignoring cache file %s (%s): asking vLLM again", path, str(exc).splitlines()[0])
            return None

    def _store(self, version: str | None, accepted: AcceptedArgs, took_s: float) -> None:
        path = self.path(version)
        record = {"key": self.key(version), "accepted": accepted.model_dump(mode="json"), "read_in_s": round(took_s, 3),
                  "read_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as fh:
                    json.dump(record, fh, indent=1, sort_keys=True)
                os.replace(tmp, path)
            except BaseException:
                os.unlink(tmp)
                raise
        except OSError as exc:
            log.warning("cannot cache vLLM's accepted engine args in %s (%s): the next start asks again", path, exc)

    # ------------------------------------------------------------------ asking

    def _ask(self, version: str | None) -> AcceptedArgs:
        problems = []
        if not self.launch:
            try:
                return self._parser(version)
            except ProbeFailed as exc:
                problems.append(f"its parser: {exc}")
                log.info("vLLM's parser could not be read (%s); trying --help=all", exc)
        try:
            return self._help(version)
        except ProbeFailed as exc:
            problems.append(f"{_HELP_SOURCE}: {exc}")
        raise ProbeFailed("; ".join(problems))

    def _parser(self, version: str | None) -> AcceptedArgs:
        out = self._child([self.python or sys.executable, "-c", _PROBE_SCRIPT])
        line = next((ln for ln in reversed(out.splitlines()) if ln.startswith(_MARK)), None)
        if line is None:
            raise ProbeFailed(f"no answer in its output ({out[-200:]!r})")
        try:
            data = json.loads(line[len(_MARK):])
            flags, source = list(data["flags"]), str(data["source"])
        except (ValueError, KeyError, TypeError) as exc:
            raise ProbeFailed(f"unreadable answer: {exc}") from None
        return self._accepted(version or str(data.get("version") or ""), source, flags)

    def _help(self, version: str | None) -> AcceptedArgs:
        out = self._child([*vllm_command(self.python, self.launch), _HELP_SOURCE])
        flags = flags_from_help(out)
        if "--help" not in flags or len(flags) < 2:
            raise ProbeFailed(f"its output lists no options ({out[-200:]!r})")
        return self._accepted(version or "unknown", _HELP_SOURCE, flags)

    def _accepted(self, version: str, source: str, flags: list[str]) -> AcceptedArgs:
        kept = sorted({f for f in flags if isinstance(f, str) and len(f) <= FLAG_MAX_CHARS and _FLAG_RE.match(f)})
        if len(kept) > MAX_FLAGS:
            raise ProbeFailed(f"{len(kept)} long options, more than the {MAX_FLAGS} a HELLO may list")
        if len(kept) < len(flags):
            log.debug("%d option string(s) of vLLM's parser are not plain long options; left out", len(flags) - len(kept))
        try:
            return AcceptedArgs(vllm_version=version or "unknown", source=source[:1000], flags=kept)
        except ValidationError as exc:
            raise ProbeFailed(f"out of bounds: {str(exc).splitlines()[0]}") from None

    def _child(self, argv: list[str]) -> str:
        env = dict(os.environ)
        if shutil.which("nvidia-smi") is None:  # as daemon.server: CPU kernels, or SIGILL on AVX2-only CPUs
            env.setdefault("VLLM_TARGET_DEVICE", "cpu")
        try:  # its own process group: a launch command's children go with it on the deadline
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                    text=True, env=env, start_new_session=True)
        except OSError as exc:
            raise ProbeFailed(f"cannot run {argv[0]}: {exc}") from None
        try:
            stdout, stderr = proc.communicate(timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):  # a grandchild that left the group keeps the pipes
                proc.communicate(timeout=KILL_WAIT_S)
            raise ProbeFailed(f"{argv[0]} did not answer within {self.timeout_s:g} s (killed)") from None
        if proc.returncode != 0:
            tail = (stderr.strip().splitlines() or [""])[-1]
            raise ProbeFailed(f"{argv[0]} exited with code {proc.returncode}: {tail[:300]}")
        return stdout
