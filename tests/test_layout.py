"""The repository's shape: the three wings never import each other, the core stays light,
environment.yml matches pyproject.toml, and the README's commands are what CI runs."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import tomllib
import yaml

REPO = Path(__file__).resolve().parents[1]
WINGS = {"coordinator", "daemon", "analysis"}
#: The simulator (servetune/sim/) is shared by the daemon's sim backend and the coordinator's plan
#: preview, so it lives in the core, and batches its arithmetic with numpy.
SIM_ALLOWED_THIRD_PARTY = {"numpy"}
CORE_ALLOWED_THIRD_PARTY = {"pydantic", "pydantic_core", "yaml"}  # pydantic_core: pydantic's own core, installed with it


def _imports(package: str) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for path in sorted((REPO / package).rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split(".")[0])
        out[str(path.relative_to(REPO))] = names
    return out


def test_wings_never_import_each_other() -> None:
    for wing in WINGS:
        for path, names in _imports(wing).items():
            others = (names & WINGS) - {wing}
            assert not others, f"{path} imports {others}: wings talk through servetune/ and the wire only"


def test_core_uses_only_pydantic_yaml_and_the_standard_library() -> None:
    stdlib = set(sys.stdlib_module_names)
    for path, names in _imports("servetune").items():
        third = {n for n in names if n not in stdlib and n != "servetune"}
        allowed = CORE_ALLOWED_THIRD_PARTY | (SIM_ALLOWED_THIRD_PARTY if "/sim/" in str(path) else set())
        assert third <= allowed, f"{path} imports {third - allowed}"


def _norm(req: str) -> str:
    return re.sub(r"\s+", "", req).lower()


def test_environment_yml_matches_pyproject() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = {_norm(r) for r in project["dependencies"]}
    wanted |= {_norm(r) for extra in ("cpu", "dev") for r in project["optional-dependencies"][extra]}
    env = yaml.safe_load((REPO / "environment.yml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    have = {_norm(r) for r in pip_section if not r.startswith("-")}
    assert have == wanted, f"only in environment.yml: {have - wanted}; only in pyproject: {wanted - have}"


def test_ci_runs_the_readme_test_command_and_install_command() -> None:
    readme = (REPO / "README.md").read_text()
    ci = (REPO / ".ci" / "run").read_text()
    test_cmd = re.search(r"^(\.venv/bin/python -m pytest[^\n]*)$", readme, re.M)
    install_cmd = re.search(r"^(\./install\.sh)\s*$", readme, re.M)
    assert test_cmd and install_cmd, "README must show the install and test commands on their own lines"
    ci_lines = {line.strip() for line in ci.splitlines()}
    assert test_cmd.group(1) in ci_lines
    assert install_cmd.group(1) in ci_lines


def test_console_script_and_packages() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["daemon"] == "daemon.cli:main"
    for folder in ("coordinator", "daemon", "analysis", "dashboards", "notebooks", "configs", "tests", "benchmarks"):
        assert (REPO / folder).is_dir(), folder
