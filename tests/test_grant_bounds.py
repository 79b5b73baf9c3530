"""Every string, list and dict a GRANT carries is bounded on the wire, the spec sections too (their
models leave paths, URLs and environment unbounded): a daemon refuses an oversized GRANT at decode,
naming the field, and the control core refuses at start a spec whose GRANT would be one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import TypeAdapter

from coordinator.control import ControlCore
from servetune.bounds import MAX_SPEC_DEPTH, MAX_SPEC_ENTRIES, SPEC_STR_MAX_CHARS, spec_tree_problem
from servetune.errors import ProtocolError, SpecError
from servetune.exitcodes import ExitCode
from servetune.messages import Grant, Message, decode, encode
from servetune.spec import ModelSpec
from tests.fleet_harness import Fleet
from tests.test_control import Clock, core, join, spec, work


def _grant_doc() -> dict[str, Any]:
    g = join(core(Clock()), "d1", "n1")
    return json.loads(encode(g))


def _decode(doc: dict[str, Any]) -> None:
    decode(json.dumps(doc).encode())


def test_a_grant_within_bounds_decodes() -> None:
    doc = _grant_doc()
    assert isinstance(decode(json.dumps(doc).encode()), Grant)


@pytest.mark.parametrize(("where", "change"), [
    ("model.served_name", None),  # bounded by its own model (200 characters)
    ("config.env", lambda d: d["config"].__setitem__("env", {f"VLLM_X{i}": "1" for i in range(MAX_SPEC_ENTRIES + 1)})),
    ("config.env", lambda d: d["config"].__setitem__("env", {"VLLM_" + "X" * SPEC_STR_MAX_CHARS: "1"})),
    ("config.env.VLLM_X", lambda d: d["config"].__setitem__("env", {"VLLM_X": "1" * (SPEC_STR_MAX_CHARS + 1)})),
    ("trials.0.manifest.experiment",
     lambda d: d["trials"][0]["manifest"].__setitem__("experiment", "e" * (SPEC_STR_MAX_CHARS + 1))),
    ("trials.0.manifest.model.path",
     lambda d: d["trials"][0]["manifest"]["model"].__setitem__("path", "/m" * SPEC_STR_MAX_CHARS)),
    ("trials.1.manifest.target",
     lambda d: d["trials"][1]["manifest"].__setitem__("target", "http://h/" + "p" * SPEC_STR_MAX_CHARS)),
])
def test_a_daemon_refuses_a_grant_with_an_oversized_spec_field(where: str, change: Any) -> None:
    doc = _grant_doc()
    if change is None:
        doc["model"]["served_name"] = "x" * 201
        with pytest.raises(ProtocolError, match="model.served_name"):
            _decode(doc)
        return
    change(doc)
    with pytest.raises(ProtocolError, match="out of bounds") as err:
        _decode(doc)
    assert where in str(err.value), err.value


def test_model_path_and_base_url_are_bounded_on_the_wire() -> None:
    doc = _grant_doc()
    doc["model"] = {"source": "path", "path": "/" + "m" * SPEC_STR_MAX_CHARS}
    with pytest.raises(ProtocolError, match=r"model\.path: a string of 4097 characters"):
        _decode(doc)
    doc = _grant_doc()
    doc["backend"] = {"kind": "openai", "base_url": "http://h:8000/" + "u" * SPEC_STR_MAX_CHARS}
    with pytest.raises(ProtocolError, match=r"backend\.base_url"):
        _decode(doc)


def test_the_tree_check_bounds_depth_entries_and_reads_models() -> None:
    deep: Any = "x"
    for _ in range(MAX_SPEC_DEPTH + 1):
        deep = [deep]
    assert "nested more than" in (spec_tree_problem(deep) or "")
    assert spec_tree_problem(list(range(MAX_SPEC_ENTRIES))) is None
    assert "entries" in (spec_tree_problem(list(range(MAX_SPEC_ENTRIES + 1)), "l") or "")
    long_path = ModelSpec(source="path", path="/" + "p" * SPEC_STR_MAX_CHARS)
    assert (spec_tree_problem(long_path, "model") or "").startswith("model.path: a string of 4097")


def test_the_core_refuses_at_start_a_spec_whose_grant_would_be_out_of_bounds() -> None:
    s = spec()
    long = s.model_copy(update={"model": ModelSpec(source="path", path="/" + "p" * SPEC_STR_MAX_CHARS)})
    with pytest.raises(SpecError, match=r"model\.path: a string of 4097 characters.*GRANT") as err:
        ControlCore(spec=long, work=work(), clock=Clock())
    assert err.value.issues[0].path == "model.path"


# ---------------------------------------------------------------------- nothing else is unbounded

#: Spec-section models, bounded on the wire by the GRANT's tree check rather than by their own fields.
TREE_CHECKED = {"ModelSpec", "BackendSpec", "Budgets", "EngineConfig", "EngineArgs", "TrialManifest", "LoadPoint",
                "FileDataset", "RandomDataset", "SharedPrefixDataset", "LengthDist", "RateSweep", "SlaSearch",
                "StopConditions"}
#: Fixed-length patterns (a sha256) bound a string as well as maxLength does.
FIXED = {"^[0-9a-f]{64}$"}


def _unbounded(schema: dict[str, Any]) -> set[str]:
    """Model names (``$defs``) that hold a string, list or free-form dict with no length bound."""
    found: set[str] = set()

    def walk(node: Any, owner: str) -> None:
        if isinstance(node, dict):
            t = node.get("type")
            if (t == "string" and "maxLength" not in node and "enum" not in node and "const" not in node
                    and node.get("pattern") not in FIXED and not str(node.get("pattern", "")).endswith("}$")):
                found.add(owner)
            if t == "array" and "maxItems" not in node:
                found.add(owner)
            if t == "object" and isinstance(node.get("additionalProperties"), dict) and "maxProperties" not in node:
                found.add(owner)
            for v in node.values():
                walk(v, owner)
        elif isinstance(node, list):
            for v in node:
                walk(v, owner)

    for name, d in schema.get("$defs", {}).items():
        walk(d, name)
    return found


def test_every_unbounded_field_on_the_wire_is_inside_a_tree_checked_grant_section() -> None:
    schema = TypeAdapter(Message).json_schema()
    unbounded = _unbounded(schema)
    assert unbounded, "the schema walk found nothing: it no longer reads the schema"
    assert unbounded <= TREE_CHECKED, f"unbounded fields outside the GRANT's checked sections: {unbounded - TREE_CHECKED}"
    # and those sections travel only inside a GRANT (where the tree check runs)
    defs = schema["$defs"]
    users = {name for name, d in defs.items() if name not in TREE_CHECKED
             and any(f'"#/$defs/{u}"' in json.dumps(d) for u in TREE_CHECKED)}
    assert users <= {"Grant", "GrantedTrial"}, users


def test_a_sweep_of_a_spec_its_grants_cannot_carry_exits_2_naming_the_field_and_writes_nothing(tmp_path: Path) -> None:
    long_url = "http://127.0.0.1:9/" + "v" * SPEC_STR_MAX_CHARS
    fleet = Fleet(tmp_path, long_url, repeats=1)
    proc = subprocess.run([sys.executable, "-m", "coordinator", "sweep", str(fleet.spec), "--results-root",
                           str(fleet.root), "--no-local-daemon", "--bind", fleet.address],
                          capture_output=True, text=True, timeout=120, env=fleet.env, cwd=tmp_path)
    assert proc.returncode == ExitCode.USAGE, proc.stderr[-3000:]
    assert "backend.base_url: a string of" in proc.stderr and "GRANT" in proc.stderr, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert not fleet.folder.exists(), "nothing may be written for a refused spec"
