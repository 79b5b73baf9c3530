"""Write the sample datasets of this folder: ``python configs/data/make_samples.py [--out DIR]``.

Both files are made here from a seeded generator (no network, no real user data), byte-identical on
every run, and checked in for the tests and ``configs/workloads.yaml``:

- ``sharegpt-sample.json``: 50 conversations in the ShareGPT format. Most are one human turn and
  one gpt reply; some have several turns or open with a system turn; two long prompts exceed 256
  tokens of the tiny model (for ``max_input_len``); one has no reply and one an empty reply (both
  skipped by the loader).
- ``prompts-sample.jsonl``: 50 lines of ``{"prompt": str, "output_len": int}``.

A test regenerates both and compares the bytes, so edit this script, never the files.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHAREGPT = "sharegpt-sample.json"
JSONL = "prompts-sample.jsonl"
SEED = 20261101

_WORDS = (
    "the a of and to in is that it for on with as was at by this be from or have an they which one you "
    "were all we when there can more if no out so said what up its about into than them only other new "
    "some could time these two may then do first any my now such like our over man me even most made "
    "after also did many before must through back years where much your way well down should because "
    "each just those people how too little state good very make world still own see men work long get "
    "here between both life being under never day same another know while last might us great old year "
    "off come since against go came right used take three server token model cache batch request queue "
    "latency memory engine prefix stream throughput rate load point sweep config kernel scheduler"
).split()
_TOPICS = (
    "how a serving engine batches requests", "why the prefix cache helps chat workloads",
    "what limits throughput on a small machine", "the trade-off between latency and batch size",
    "how to read a latency percentile", "what a load generator must never do",
    "how a scheduler keeps the queue short", "why warm-up requests are left out of a measurement",
)


def _sentence(rng: random.Random, n_words: int) -> str:
    words = [rng.choice(_WORDS) for _ in range(n_words)]
    return " ".join(words).capitalize() + rng.choice([".", ".", ".", "?", "!"])


def _text(rng: random.Random, n_words: int) -> str:
    sentences, left = [], n_words
    while left > 0:
        k = min(left, rng.randint(5, 16))
        sentences.append(_sentence(rng, k))
        left -= k
    return " ".join(sentences)


def _question(rng: random.Random, n_words: int) -> str:
    return f"Explain {rng.choice(_TOPICS)}. " + _text(rng, n_words)


def sharegpt(rng: random.Random) -> list[dict[str, object]]:
    convs: list[dict[str, object]] = []
    for i in range(50):
        turns: list[dict[str, str]] = []
        if i % 10 == 3:
            turns.append({"from": "system", "value": "You are a concise assistant. " + _text(rng, 8)})
        if i in (17, 41):  # long prompts: beyond 256 tokens of the tiny model
            turns.append({"from": "human", "value": _question(rng, rng.randint(75, 90))})
        else:
            turns.append({"from": "human", "value": _question(rng, rng.randint(4, 30))})
        if i == 29:
            pass  # no reply: skipped
        elif i == 35:
            turns.append({"from": "gpt", "value": ""})  # empty reply: skipped
        else:
            turns.append({"from": "gpt", "value": _text(rng, rng.randint(3, 25))})
        if i % 7 == 5:  # a follow-up exchange: only the first human turn and its reply are used
            turns.append({"from": "human", "value": _question(rng, rng.randint(3, 12))})
            turns.append({"from": "gpt", "value": _text(rng, rng.randint(3, 12))})
        convs.append({"id": f"sample-{i:03d}", "conversations": turns})
    return convs


def jsonl(rng: random.Random) -> list[dict[str, object]]:
    return [{"prompt": _question(rng, rng.randint(4, 30)), "output_len": rng.randint(8, 64)} for _ in range(50)]


def write(out: Path) -> list[Path]:
    """Write both files into ``out`` and return their paths."""
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(SEED)
    paths = [out / SHAREGPT, out / JSONL]
    paths[0].write_text(json.dumps(sharegpt(rng), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    paths[1].write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in jsonl(rng)), encoding="utf-8")
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE, help="folder to write into (default: this folder)")
    args = parser.parse_args(argv)
    for path in write(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
