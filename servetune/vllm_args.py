"""Which engine flags a daemon's vLLM accepts, and which flags an engine config needs.

A daemon asks the vLLM it will run (its own argument parser, once per vLLM version and interpreter:
:mod:`daemon.vllm_args`) which long options it accepts and reports them in HELLO
(``Capabilities.engine_args``, an :class:`AcceptedArgs`). Before granting a ``vllm`` batch to that
daemon the coordinator compares them with the flags the batch's engine config would pass
(:func:`missing_flags`): a config needing a flag that vLLM does not accept is never started there
(vLLM would refuse it at start with "unrecognized arguments"); :func:`refusal_text` says why.

The comparison is by exact option string, so ``--no-enforce-eager`` (what ``enforce_eager: false``
becomes) counts apart from ``--enforce-eager``: a vLLM whose flag is a plain ``store_true`` accepts
the one and not the other. Values are not compared (a ``--block-size`` choice, say): vLLM judges
those at start, within seconds.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Annotated

from pydantic import Field

from servetune.bounds import Label, WireModel
from servetune.spec import EngineArgs

#: A long option as vLLM's parser names it: ``--`` then letters, digits, ``.``, ``_``, ``-``.
FLAG_PATTERN = r"^--[A-Za-z0-9][A-Za-z0-9._-]*$"
FLAG_MAX_CHARS = 200
Flag = Annotated[str, Field(min_length=3, max_length=FLAG_MAX_CHARS, pattern=FLAG_PATTERN)]
#: The most flags one report may list (vLLM 0.32's API server has 406 long options).
MAX_FLAGS = 4096
#: The folder under ``$SERVETUNE_HOME`` where daemons cache what each vLLM accepts.
CACHE_DIR_NAME = "vllm-args"
#: ``0`` turns ``daemon start --check-engine-args`` off by default on this node (its flag wins).
CHECK_ENGINE_ARGS_ENV = "SERVETUNE_CHECK_ENGINE_ARGS"


def cache_dir(home: Path) -> Path:
    """Where the daemons of servetune home ``home`` cache their vLLMs' accepted flags."""
    return home / CACHE_DIR_NAME


class AcceptedArgs(WireModel):
    """The long options one vLLM's API server accepts, as its own parser (or its ``--help=all``) lists them.

    ``vllm_version``: the version they were read from; ``source``: how (the parser function's
    dotted name, or ``--help=all``); ``flags``: sorted, each once."""

    vllm_version: Annotated[Label, Field(min_length=1)]
    source: Annotated[Label, Field(min_length=1)]
    flags: list[Flag] = Field(max_length=MAX_FLAGS)


def config_flags(args: EngineArgs) -> list[str]:
    """The flags (without values) that ``args`` adds to vLLM's command line, in its order."""
    return [token for token in args.cli_args() if token.startswith("--")]


def missing_flags(needed: Iterable[str], accepted: Collection[str]) -> list[str]:
    """The flags of ``needed`` (a config's :func:`config_flags`) that ``accepted`` (a vLLM's
    :attr:`AcceptedArgs.flags`, best as a set) does not hold; empty: that vLLM takes them all."""
    return [flag for flag in needed if flag not in accepted]


def refusal_text(missing: list[str], accepted: AcceptedArgs, daemon_id: str) -> str:
    """Why a config is not run on ``daemon_id``, first line first (the sweep prints that line)."""
    names = ", ".join(missing)
    return (f"vLLM {accepted.vllm_version} on daemon {daemon_id} does not accept {names}: not started there\n"
            f"refused before any run: that vLLM's argument parser ({accepted.source}, read by the daemon) lists "
            f"{len(accepted.flags)} long options and not {names}; run this config on a vLLM that has "
            f"{'it' if len(missing) == 1 else 'them'} (then `sweep --retry-failed`), or take the arg out of the spec")
