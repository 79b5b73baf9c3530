"""Resolve a spec's model on this node: what to pass to ``--model``, its vocabulary size, load format,
and where its ``tokenizer.json`` lies (chat prompts and file datasets need the tokenizer)."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from daemon.tiny_model import default_cache_dir, generate
from servetune.errors import ServetuneError
from servetune.spec import ModelSpec
from servetune.tiny import TINY_VOCAB_SIZE

log = logging.getLogger(__name__)


class ModelResolutionError(ServetuneError):
    """The model could not be found or read on this node."""


@dataclass(frozen=True)
class ResolvedModel:
    """``tokenizer_path``: the model's ``tokenizer.json`` on this node, None when it has none."""

    model_arg: str
    vocab_size: int
    load_format: str | None
    tokenizer_path: str | None = None


def resolve_model(spec: ModelSpec) -> ResolvedModel:
    """Generate the tiny model if needed, or check a local path / read a hub model's config."""
    if spec.source == "tiny":
        path = generate(default_cache_dir())
        return ResolvedModel(str(path), TINY_VOCAB_SIZE, "dummy", str(path / "tokenizer.json"))
    if spec.source == "path":
        assert spec.path is not None
        cfg = Path(spec.path) / "config.json"
        try:
            config = json.loads(cfg.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ModelResolutionError(f"cannot read {cfg} on this node: {exc}") from None
        tokenizer = Path(spec.path) / "tokenizer.json"
        return ResolvedModel(spec.path, _vocab(config, str(cfg)), spec.load_format,
                             str(tokenizer) if tokenizer.is_file() else None)
    assert spec.id is not None
    try:
        from huggingface_hub import hf_hub_download

        cfg_path = hf_hub_download(spec.id, "config.json", revision=spec.revision)
        config = json.loads(Path(cfg_path).read_text(encoding="utf-8"))
    except Exception as exc:  # hub errors come in many classes; all mean "not resolvable here"
        raise ModelResolutionError(f"cannot resolve hub model {spec.id!r} on this node: {exc}") from None
    return ResolvedModel(spec.id, _vocab(config, spec.id), spec.load_format, _hub_tokenizer(spec))


def _hub_tokenizer(spec: ModelSpec) -> str | None:
    """The hub model's ``tokenizer.json`` (downloaded like its config.json), None when absent."""
    assert spec.id is not None
    try:
        from huggingface_hub import hf_hub_download

        return str(hf_hub_download(spec.id, "tokenizer.json", revision=spec.revision))
    except Exception as exc:  # hub errors come in many classes; a workload that needs it says so later
        log.warning("no tokenizer.json for hub model %r on this node: %s", spec.id, exc)
        return None


def _vocab(config: object, where: str) -> int:
    if isinstance(config, dict):
        text_config = config.get("text_config")
        for source in (config, text_config if isinstance(text_config, dict) else {}):
            vocab = source.get("vocab_size")
            if isinstance(vocab, int) and vocab > 10:
                return vocab
    raise ModelResolutionError(f"{where} has no usable vocab_size")
