"""Strict specs: every bad input a new user might try is refused fast with its YAML path, exit 2
from `validate` and `sweep`, and nothing written; nothing crashes, hangs or exhausts memory.

What could hang or exhaust memory (an alias bomb, a FIFO, /dev/zero) runs in one child process
under a wall-clock timeout and an address-space limit, so a regression fails by being killed
instead of by a timed assertion."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import textwrap
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from coordinator.cli import main
from servetune.spec import ExperimentSpec, parse_spec
from servetune.yamlsafe import MAX_ALIASES, MAX_DEPTH, MAX_NODES, MAX_SPEC_BYTES, load_yaml
from tests.test_planner_designs import BIG
from tests.test_spec import GOOD, _issues

REPO = Path(__file__).resolve().parents[1]

#: Nine lines that expand to 9^9 strings (the "billion laughs").
ALIAS_BOMB = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [" + ",".join([f"*{chr(97 + i)}"] * 9) + "]\n" for i in range(8)
) + "name: bomb\nload_points: [{name: a, request_rate: 1, num_requests: 1}]\n"


@pytest.mark.parametrize(
    "text,needle",
    [
        (GOOD + "backend: {kind: vllm}\nbackend: {kind: openai, base_url: 'http://x:1'}\n",
         "backend: duplicate key 'backend' (first at line"),
        (GOOD.replace("max_num_seqs: [2, 8]", "max_num_seqs: [2, 8]\n    max_num_seqs: [4]"),
         "engine.grid.max_num_seqs: duplicate key 'max_num_seqs'"),
        (GOOD.replace("repeats: 2", "repeats: yes"), "repeats: expected a number, got the boolean True"),
        (GOOD.replace("max_num_seqs: [2, 8]", "max_num_seqs: [2, yes]"),
         "engine.grid.max_num_seqs[1]: expected a number, got the boolean True"),
        (GOOD.replace("fixed: {max_model_len: 512}", "fixed: {max_model_len: 512, max_num_seqs: yes}"),
         "engine.fixed.max_num_seqs: expected a number, got the boolean True"),
        (GOOD.replace("fixed: {max_model_len: 512}", "fixed: {max_model_len: 512, block_size: yes}"),
         "engine.fixed.block_size: expected a number, got the boolean True"),
        (GOOD.replace("request_rate: 4", "request_rate: .inf"), "load_points[0].request_rate: Input should be a finite"),
        (GOOD.replace("request_rate: 4", "request_rate: .nan"), "load_points[0].request_rate: Input should be a finite"),
        (GOOD.replace("max_ms: 500", "max_ms: -.inf"), "slos[0].max_ms: Input should be a finite number"),
        (GOOD.replace("max_ms: 500", "max_ms: '500'"), "slos[0].max_ms: Input should be a valid number"),
        (GOOD.replace("VLLM_CPU_KVCACHE_SPACE: 1", 'VLLM_CPU_KVCACHE_SPACE: "1\\0"'),
         "engine.env.VLLM_CPU_KVCACHE_SPACE: contains a NUL character"),
        (GOOD + "description: &d [*d]\n", "description[0]: an alias refers to a node that contains it"),
        (GOOD + "---\nname: two\n", "expected one YAML document, found another"),
        ("name: deep\ndescription: " + "[" * 50_000 + "]" * 50_000 + "\n", f"nested deeper than {MAX_DEPTH} levels"),
        ("k0:\n" + "".join(" " * i + f"k{i}:\n" for i in range(1, 200)),
         "k0.k1.k2.k3.k4.k5.k6.k7.k8.k9.k10.k11.k12.k13.k14.k15.k16.k17.k18.k19.k20.k21.k22"),
        ("name: n\ndescription: [" + ",".join(["1"] * (MAX_NODES + 1)) + "]\n", f"holds more than {MAX_NODES:,}"),
        ("a: &a x\nb: [" + ",".join(["*a"] * (MAX_ALIASES + 1)) + "]\n", f"more than {MAX_ALIASES} aliases"),
        ("name: big\ndescription: '" + "x" * MAX_SPEC_BYTES + "'\n", f"larger than {MAX_SPEC_BYTES:,} bytes"),
        ("name: n\nrepeats: " + "1" * 5000 + "\n", "malformed YAML"),
    ],
)
def test_bad_yaml_and_values_refused_with_their_path(text: str, needle: str) -> None:
    issues = _issues(text)
    assert any(needle in i for i in issues), issues


def test_the_bounded_loader_reads_what_yaml_reads() -> None:
    """Anchors, aliases, merge keys (which may override merged keys), tags and flow/block styles
    load exactly as PyYAML's safe loader reads them."""
    import yaml

    text = textwrap.dedent(
        """
        base: &base {request_rate: 4, num_requests: 8}
        points:
          - {<<: *base, name: a}
          - <<: *base
            name: b
            request_rate: 2
        tags: [!!str 3, 2020-01-01, 0x10, 1e3, ~, 'q', "d"]
        shared: &s [1, {c: d}]
        again: *s
        """
    )
    assert load_yaml(text) == yaml.safe_load(text)
    assert load_yaml("") is None


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    "mutation,needle",
    [
        (("request_rate: 4", "request_rate: .inf"), "load_points[0].request_rate: Input should be a finite number"),
        (("repeats: 2", "repeats: yes"), "repeats: expected a number, got the boolean True"),
        (("repeats: 2", "repeats: 2\nbackend: {kind: vllm}\nbackend: {kind: vllm}"), "backend: duplicate key"),
        (("VLLM_CPU_KVCACHE_SPACE: 1", 'VLLM_CPU_KVCACHE_SPACE: "\\0"'), "contains a NUL character"),
    ],
)
def test_validate_and_sweep_exit_2_and_write_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], mutation: tuple[str, str], needle: str
) -> None:
    spec_file = tmp_path / "bad.yaml"
    spec_file.write_text(GOOD.replace(*mutation))
    root = tmp_path / "runs"
    for argv in (["validate", str(spec_file)], ["sweep", str(spec_file), "--results-root", str(root)]):
        code, err = _cli(capsys, *argv)
        assert code == 2 and needle in err, (argv, code, err)
    assert not root.exists(), "an invalid spec must not create anything"


def test_oversized_spec_and_dataset_files_are_refused_by_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A spec file over MAX_SPEC_BYTES and a dataset file over MAX_DATASET_BYTES (sparse files: no disk
    is used) are refused by their size, naming the key path, before they are read: exit 2, nothing written."""
    from servetune.spec import MAX_DATASET_BYTES

    big_spec = tmp_path / "big-spec.yaml"
    with big_spec.open("wb") as f:
        f.truncate(MAX_SPEC_BYTES + 1)
    data = tmp_path / "huge.jsonl"
    with data.open("wb") as f:
        f.truncate(MAX_DATASET_BYTES + 1)
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(GOOD.replace("input_len: 32, output_len: 16}",
                                      f"dataset: {{kind: jsonl, path: {data}}}, input_len: 32, output_len: 16}}", 1))
    cases = [(big_spec, f"is {MAX_SPEC_BYTES + 1:,} bytes; a spec file may hold at most {MAX_SPEC_BYTES:,}"),
             (spec_file, f"load_points[0].dataset.path: {data} is {MAX_DATASET_BYTES + 1:,} bytes; a dataset file "
                         f"may hold at most {MAX_DATASET_BYTES:,}")]
    root = tmp_path / "runs"
    for path, needle in cases:
        for argv in (["validate", str(path)], ["sweep", str(path), "--results-root", str(root)]):
            code, err = _cli(capsys, *argv)
            assert code == 2 and needle in err, (argv, code, err)
    assert not root.exists(), "an invalid spec must not create anything"


#: Run in a child under `timeout` and an address-space limit: every case through the real CLI,
#: both commands; prints one JSON line per command.
_CHILD = textwrap.dedent(
    """
    import contextlib, io, json, sys
    from coordinator.cli import main
    for argv in json.loads(sys.argv[1]):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            code = main(argv)
        print(json.dumps({"argv": argv, "code": code, "out": out.getvalue(), "err": err.getvalue()}), flush=True)
    """
)


def _limit_memory() -> None:
    import resource

    limit = 1536 << 20  # 1.5 GiB of address space: the interpreter and its imports need about 0.7
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_what_could_hang_or_exhaust_memory_is_refused_fast(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(ALIAS_BOMB)
    fifo_spec = tmp_path / "fifo.yaml"
    os.mkfifo(fifo_spec)
    fifo_data = tmp_path / "data.jsonl"
    os.mkfifo(fifo_data)
    dataset = "dataset: {kind: jsonl, path: %s}, input_len: 32, output_len: 16}"
    big = tmp_path / "big.yaml"
    big.write_text(BIG)  # listing its 700,000 configs took minutes and gigabytes
    cases = {
        "bomb": (bomb, "expands to more than 100,000 values"),
        "big-grid": (big, "engine: the engine space describes 700,000 configs"),
        "fifo-spec": (fifo_spec, "is not a regular file (a FIFO): a spec file must be one"),
    }
    for name, path in (("dev-zero", "/dev/zero"), ("fifo-data", str(fifo_data))):
        spec = tmp_path / f"{name}.yaml"
        spec.write_text(GOOD.replace("input_len: 32, output_len: 16}", dataset % path, 1))
        kind = "a character device" if name == "dev-zero" else "a FIFO"
        cases[name] = (spec, f"load_points[0].dataset.path: {path} is not a regular file ({kind})")
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    os.mkfifo(model_dir / "config.json")
    model_spec = tmp_path / "fifo-model.yaml"
    model_spec.write_text(GOOD.replace("model: {source: tiny}", f"model: {{source: path, path: {model_dir}}}"))
    cases["fifo-model-config"] = (model_spec, f"model.path: no config.json in model folder {model_dir}")
    runs = {name: str(tmp_path / f"runs-{name}") for name in cases}
    argvs = [argv for name, (path, _) in cases.items()
             for argv in (["validate", str(path)], ["sweep", str(path), "--results-root", runs[name]])]
    # Sampled designs over the same 700,000 configs plan without listing them (listing took gigabytes).
    sampled = {}
    for kind in ("random", "quasi-random"):
        sampled[kind] = tmp_path / f"big-{kind}.yaml"
        sampled[kind].write_text(BIG + f"planner: {{kind: {kind}, n_configs: 30}}\n")
    argvs += [["validate", str(sampled["random"])],
              ["sweep", str(sampled["quasi-random"]), "--dry-run", "--results-root", str(tmp_path / "runs-dry")]]
    arg = json.dumps(argvs)
    proc = subprocess.run(
        ["timeout", "-s", "KILL", "90", sys.executable, "-c", _CHILD, arg], capture_output=True, text=True,
        timeout=120, cwd=REPO, preexec_fn=_limit_memory,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == 0, (proc.returncode, proc.stdout[-2000:], proc.stderr[-3000:])
    results = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(results) == 2 * len(cases) + 2, proc.stdout
    for result, design in zip(results[-2:], ("random", "quasi-random")):
        assert result["code"] == 0, result
        assert f"{design} design" in result["out"] and "30 of 700000 engine configs" in result["out"], result
    results = results[:-2]
    for (name, (_, needle)), pair in zip(cases.items(), zip(results[::2], results[1::2])):
        for result in pair:
            assert result["code"] == 2 and needle in result["err"], (name, result)
        assert not Path(runs[name]).exists(), name


#: A spec that uses every section, so an unknown key can be put in each.
FULL: dict[str, Any] = {
    "name": "full",
    "model": {"source": "tiny"},
    "engine": {
        "fixed": {"max_model_len": 512},
        "grid": {"max_num_seqs": [2, 4]},
        "configs": [{"max_num_seqs": 8, "env": {"VLLM_Y": "1"}}],
        "env": {"VLLM_CPU_KVCACHE_SPACE": "1"},
    },
    "load_points": [
        {"name": "a", "request_rate": 4, "num_requests": 8, "input_len": {"dist": "uniform", "min": 8, "max": 32},
         "output_len": 16, "dataset": {"kind": "random"}, "stop": {"max_errors": 3}},
        {"name": "b", "max_concurrency": 4, "num_requests": 8, "input_len": 64,
         "dataset": {"kind": "shared_prefix", "num_prefixes": 2, "suffixes_per_prefix": 2, "prefix_len": 16}},
        {"name": "c", "max_concurrency": 4, "num_requests": 8, "dataset": {"kind": "jsonl", "path": "/data.jsonl"}},
        {"name": "d", "num_requests": 8, "rate_sweep": {"num_rates": 2}},
        {"name": "e", "num_requests": 400, "sla_search": {"min_rps": 1, "max_rps": 8}},
    ],
    "slos": [{"metric": "ttft_ms", "max_ms": 500}],
    "ranking": {"objective": "output_throughput"},
    "repeats": 1,
    "baseline": {"engine": {"max_num_seqs": 2}},
    "planner": {"kind": "grid"},
    "budgets": {"trial_timeout_s": 600},
    "backend": {"kind": "vllm"},
    "hardware": {"targets": [{"hardware_class": "1xH100-80GB"}, {"name": "a100s", "gpu_model": "*A100*"}],
                 "failover_to": {"1xH100-80GB": ["1xH200-141GB"]}, "co_tenancy": True,
                 "groups": [{"name": "box", "daemons": ["node-*"], "group_max_concurrency": 2}]},
}

SECTIONS = ["", "model", "engine", "engine.fixed", "engine.grid", "engine.configs[0]", "load_points[0]",
            "load_points[0].input_len", "load_points[0].dataset", "load_points[1].dataset", "load_points[2].dataset",
            "load_points[0].stop", "load_points[3].rate_sweep", "load_points[4].sla_search",
            "slos[0]", "ranking", "baseline", "baseline.engine",
            "planner", "budgets", "backend", "hardware", "hardware.targets[1]",
            "hardware.groups[0]"]


def _parts(path: str) -> list[str | int]:
    return [int(p) if p.isdigit() else p for p in path.replace("]", "").replace("[", ".").split(".") if p]


def _reachable_models(model: type[BaseModel], seen: set[type[BaseModel]]) -> set[type[BaseModel]]:
    seen.add(model)
    for info in model.model_fields.values():
        stack = [info.annotation]
        while stack:
            ann = stack.pop()
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                if ann not in seen:
                    _reachable_models(ann, seen)
            else:
                stack.extend(typing.get_args(ann))
    return seen


def test_every_section_is_covered_below() -> None:
    """SECTIONS reaches every model of the spec: a new section must be added there (and so tested)."""
    spec = parse_spec(yaml.safe_dump(FULL))
    covered = set()
    for path in SECTIONS:
        obj: Any = spec
        for part in _parts(path):
            obj = obj[part] if isinstance(part, int) else getattr(obj, part)
        covered.add(type(obj))
    assert covered == _reachable_models(ExperimentSpec, set())


@pytest.mark.parametrize("section", SECTIONS)
def test_unknown_keys_are_refused_in_every_section(section: str) -> None:
    data = copy.deepcopy(FULL)
    target: Any = data
    for part in _parts(section):
        target = target[part]
    target["warmup_request"] = 3  # a typo of load_points[].warmup_requests: silently dropped if allowed
    issues = _issues(yaml.safe_dump(data))
    where = f"{section}.warmup_request" if section else "warmup_request"
    assert any(i.startswith(f"{where}: unknown key 'warmup_request'") for i in issues), issues
