"""Generate the embedded tiny model offline: ``python -m daemon.tiny_model OUT_DIR``.

Writes ``config.json`` for a small LlamaForCausalLM and a byte-level BPE tokenizer (with a chat
template) trained on deterministically generated text. The output is byte-identical across runs
and machines for one :data:`servetune.tiny.TINY_MODEL_VERSION`; vLLM serves it with
``--load-format dummy`` (random weights), so no model hub is needed.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import logging
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path

from servetune.tiny import TINY_MODEL_CONFIG, TINY_MODEL_VERSION, TINY_VOCAB_SIZE

log = logging.getLogger(__name__)

SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<unk>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
_SYLLABLES = ["ka", "lo", "mi", "ne", "ru", "sa", "to", "vi", "ze", "qu", "an", "el", "or", "ith"]


def _corpus(seed: int = 1234, n_lines: int = 4000) -> list[str]:
    """Deterministic pseudo-text: the tokenizer must be the same bytes on every machine."""
    rng = random.Random(seed)
    words = ["".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 4))) for _ in range(3000)]
    words += ["the", "a", "of", "and", "to", "in", "is", "vLLM", "serve", "token", "model"]
    lines = []
    for _ in range(n_lines):
        n = rng.randint(4, 16)
        line = " ".join(rng.choice(words) for _ in range(n))
        lines.append(line.capitalize() + rng.choice([".", "?", "!", ","]) + f" {rng.randint(0, 999)}")
    return lines


def _write_tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    (out / "tokenizer.json").write_text(tok.to_str(pretty=True), encoding="utf-8")
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "pad_token": "<pad>",
        "model_max_length": TINY_MODEL_CONFIG["max_position_embeddings"],
        "clean_up_tokenization_spaces": False,
        "add_bos_token": False,
        "chat_template": CHAT_TEMPLATE,
    }
    _write_json(out / "tokenizer_config.json", tokenizer_config)
    _write_json(
        out / "special_tokens_map.json",
        {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"},
    )


def _write_json(path: Path, obj: object) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def generate(out_dir: str | os.PathLike[str]) -> Path:
    """Write the tiny model into ``out_dir`` atomically and return its path.

    An existing complete model of the same version is left as it is. Safe when several processes
    (daemons sharing a node's cache) generate it at once: one writes, under a lock file beside
    ``out_dir``, and the others find its model complete.
    """
    out = Path(out_dir)
    if _complete(out):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # held until the file closes
        if _complete(out):
            return out
        if out.exists() and any(out.iterdir()):
            raise FileExistsError(f"{out} exists and is not a servetune tiny model v{TINY_MODEL_VERSION}")
        tmp = Path(tempfile.mkdtemp(prefix=".tiny-", dir=out.parent))
        os.chmod(tmp, 0o755)
        try:
            _write_json(tmp / "config.json", TINY_MODEL_CONFIG)
            _write_json(tmp / "generation_config.json", {"bos_token_id": 1, "eos_token_id": 2})
            _write_tokenizer(tmp)
            (tmp / "servetune-tiny-version").write_text(TINY_MODEL_VERSION + "\n", encoding="utf-8")
            if out.exists():
                out.rmdir()
            os.replace(tmp, out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    log.info("tiny model v%s written to %s", TINY_MODEL_VERSION, out)
    return out


def _complete(out: Path) -> bool:
    marker = out / "servetune-tiny-version"
    return marker.exists() and marker.read_text(encoding="utf-8").strip() == TINY_MODEL_VERSION


def default_cache_dir() -> Path:
    """Where a node keeps generated models: ``$SERVETUNE_CACHE`` or ``~/.cache/servetune``."""
    root = os.environ.get("SERVETUNE_CACHE") or os.path.join(Path.home(), ".cache", "servetune")
    return Path(root) / "models" / f"tiny-v{TINY_MODEL_VERSION}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m daemon.tiny_model", description=__doc__)
    parser.add_argument("out_dir", help="folder to write the model into (created)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        path = generate(args.out_dir)
    except FileExistsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
