"""The tiny model is generated offline, byte-identical across runs, with a chat template."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from daemon.tiny_model import generate
from servetune.tiny import TINY_MODEL_CONFIG


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_byte_identical_across_runs(tmp_path: Path) -> None:
    a = generate(tmp_path / "a")
    proc = subprocess.run([sys.executable, "-m", "daemon.tiny_model", str(tmp_path / "b")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert _tree(a) == _tree(tmp_path / "b")
    assert {"config.json", "tokenizer.json", "tokenizer_config.json"} <= set(_tree(a))


def test_config_and_tokenizer_are_usable(tmp_path: Path) -> None:
    out = generate(tmp_path / "m")
    config = json.loads((out / "config.json").read_text())
    assert config == TINY_MODEL_CONFIG and config["architectures"] == ["LlamaForCausalLM"]
    tok_config = json.loads((out / "tokenizer_config.json").read_text())
    assert "messages" in tok_config["chat_template"]
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    assert tok.get_vocab_size() == config["vocab_size"]
    ids = tok.encode("the model serve token").ids
    assert ids and tok.decode(ids) == "the model serve token"


def test_existing_folder_is_not_clobbered(tmp_path: Path) -> None:
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError):
        generate(tmp_path / "x")
    assert (tmp_path / "x" / "keep.txt").read_text() == "mine"
    again = generate(tmp_path / "y")
    assert generate(again) == again  # a complete model of the same version is reused


def test_concurrent_generation_into_one_cache_is_safe(tmp_path: Path) -> None:
    """Two daemons on one node share its cache and may generate the model at the same moment."""
    out = tmp_path / "shared" / "tiny"
    procs = [subprocess.Popen([sys.executable, "-m", "daemon.tiny_model", str(out)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(4)]
    results = [p.communicate(timeout=180) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], [err[-800:] for _, err in results]
    assert _tree(out) == _tree(generate(tmp_path / "alone"))
