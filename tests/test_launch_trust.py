"""A daemon runs only what its own operator configured (``daemon start --vllm-python`` /
``--vllm-launch``): a spec that still names a command is refused, a GRANT that carries one is
refused at decode on the daemon and never runs, and the operator's launch command is what starts vLLM.
Old experiment folders keep their spec hash (tests/test_compat.py resumes them)."""

from __future__ import annotations

import json
import os
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from daemon.batch import BatchContext, BatchRunner
from daemon.cli import build_parser, vllm_from_environment
from servetune.errors import ProtocolError, SpecError
from servetune.exitcodes import ExitCode
from servetune.manifest import plan_grid
from servetune.messages import Grant, GrantedTrial, Ready, Result, Shutdown, decode, encode
from servetune.spec import parse_spec
from tests.fakes.openai_server import FakeOpenAIServer
from tests.test_bounds import FP
from tests.test_daemon_agent import TTL_S, Daemon, ScriptedCoordinator

SPEC = textwrap.dedent(
    """
    name: trust
    model: {{source: path, path: "{model}", served_name: fake}}
    engine: {{fixed: {{max_num_seqs: 3}}}}
    planner: {{randomize: false}}
    budgets: {{server_start_timeout_s: 20, trial_timeout_s: 30}}
    load_points:
      - {{name: one, max_concurrency: 1, num_requests: 1, input_len: 8, output_len: 4}}
    """
)


def _grant(tmp_path: Path) -> Grant:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps({"vocab_size": 1000}))
    spec = parse_spec(SPEC.format(model=model))
    batch = plan_grid(spec).batches[0]
    return Grant(batch_id="b1", epoch=1, ttl_s=TTL_S, model=spec.model, backend=spec.backend, budgets=spec.budgets,
                 config=batch.config, trials=[GrantedTrial(trial_id=t.trial_id, attempt=1, manifest=t)
                                              for t in batch.trials])


def _with_backend(grant: Grant, **backend: object) -> bytes:
    doc = json.loads(encode(grant))
    doc["backend"].update(backend)
    return json.dumps(doc).encode()


def test_a_spec_naming_a_command_is_refused_with_where_it_moved(tmp_path: Path) -> None:
    text = SPEC.format(model=tmp_path)
    (tmp_path / "config.json").write_text("{}")
    for key, value, flag in (("python", "/usr/bin/python3", "--vllm-python"),
                             ("launch", "[/bin/sh, -c, id]", "--vllm-launch")):
        with pytest.raises(SpecError) as err:
            parse_spec(text + f"backend: {{kind: vllm, {key}: {value}}}\n")
        message = str(err.value)
        assert f"backend.{key} is no longer a spec key" in message and flag in message, message
    # a stored spec (JSON of a validated spec, as the store keeps it) holds them as null: it loads
    stored = parse_spec(text).model_dump(mode="json")
    stored["backend"].update(python=None, launch=None)
    assert parse_spec(json.dumps(stored)).spec_hash() == parse_spec(text).spec_hash()


def test_a_grant_carrying_a_command_is_refused_at_decode(tmp_path: Path) -> None:
    grant = _grant(tmp_path)
    assert decode(encode(grant)) == grant
    for hostile in ({"launch": ["/bin/sh", "-c", "id"]}, {"python": "/bin/sh"}, {"command": ["/bin/sh"]}):
        with pytest.raises(ProtocolError, match="backend"):
            decode(_with_backend(grant, **hostile))
    # an older coordinator's GRANT names them as null: still work for the daemon's own vLLM
    assert decode(_with_backend(grant, python=None, launch=None)) == grant


def test_the_launch_flag_is_split_like_a_shell_and_never_run_by_one() -> None:
    args = build_parser().parse_args(["start", "--coordinator", "tcp://h:1",
                                      "--vllm-launch", "apptainer exec 'my image.sif' python3 -m x; id"])
    assert args.vllm_launch == ["apptainer", "exec", "my image.sif", "python3", "-m", "x;", "id"]
    env = {"SERVETUNE_VLLM_LAUNCH": "srun --ntasks=1 python -m vllm.entrypoints.openai.api_server",
           "SERVETUNE_VLLM_PYTHON": "/opt/vllm/bin/python"}
    args = build_parser().parse_args(["start", "--coordinator", "tcp://h:1"])
    vllm_from_environment(args, env)
    assert args.vllm_launch[:2] == ["srun", "--ntasks=1"] and args.vllm_python is None  # the launch command wins
    args = build_parser().parse_args(["start", "--coordinator", "tcp://h:1"])
    vllm_from_environment(args, {"SERVETUNE_VLLM_PYTHON": "/opt/vllm/bin/python"})
    assert args.vllm_launch is None and args.vllm_python == "/opt/vllm/bin/python"
    args = build_parser().parse_args(["start", "--coordinator", "tcp://h:1", "--vllm-python", "/mine/python"])
    vllm_from_environment(args, env)  # a flag wins over the environment
    assert args.vllm_launch is None and args.vllm_python == "/mine/python"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["start", "--coordinator", "tcp://h:1", "--vllm-python", "/p", "--vllm-launch", "x"])


@pytest.mark.timeout(30)
def test_a_launch_command_that_is_not_there_is_an_unusable_node(tmp_path: Path) -> None:
    import subprocess

    proc = subprocess.run([sys.executable, "-m", "daemon", "start", "--coordinator", "tcp://127.0.0.1:9",
                           "--workdir", str(tmp_path), "--vllm-launch", "no-such-launcher --flag"],
                          capture_output=True, text=True, timeout=20)
    assert proc.returncode == ExitCode.DAEMON_CONFIG, proc.stderr
    assert "--vllm-launch 'no-such-launcher --flag'" in proc.stderr, proc.stderr


@pytest.mark.timeout(90)
def test_a_hostile_grant_runs_nothing_and_the_operator_s_launch_runs_vllm(tmp_path: Path) -> None:
    """A coordinator sends a GRANT whose backend names ``launch``: the daemon drops it (the marker
    the command would write never appears) and stays in the session. A proper GRANT then starts
    the operator's ``--vllm-launch`` (a stand-in for vLLM that records its argv and exits 1): the
    result is a measurement failure whose server argv begins with the operator's command."""
    pwned = tmp_path / "pwned"
    seen_argv = tmp_path / "argv.json"
    fake_vllm = tmp_path / "fake_vllm.py"
    fake_vllm.write_text(f"import json, sys\nopen({str(seen_argv)!r}, 'w').write(json.dumps(sys.argv))\n"
                         "print('ValueError: not vLLM', file=sys.stderr)\nsys.exit(1)\n")
    coordinator = ScriptedCoordinator()
    d = Daemon(tmp_path, "--coordinator", coordinator.address, "--vllm-launch", f"{sys.executable} {fake_vllm}")
    try:
        _hostile_then_proper(coordinator, d, tmp_path, pwned, seen_argv, fake_vllm)
    finally:
        d.kill()
        coordinator.close()


def _hostile_then_proper(coordinator: ScriptedCoordinator, d: Daemon, tmp_path: Path, pwned: Path, seen_argv: Path,
                         fake_vllm: Path) -> None:
    coordinator.join()
    grant = _grant(tmp_path)
    hostile = _with_backend(grant, launch=[sys.executable, "-c", f"open({str(pwned)!r}, 'w')"])
    assert coordinator.peer is not None
    coordinator.sock.send_multipart([coordinator.peer, hostile])
    ready = coordinator.expect(Ready, 15)  # a READY the hostile GRANT did not answer comes again
    time.sleep(0.5)
    assert not pwned.exists(), "a GRANT's command ran on the daemon"
    assert ("dropping malformed message from the coordinator: invalid message at GRANT.backend: "
            "Value error, backend.launch is no longer a spec key") in d.log(), d.log()[-3000:]
    coordinator.send(grant.model_copy(update={"seq": ready.seq}))
    result = coordinator.expect(Result, 45)
    assert result.outcome.status == "failed" and result.outcome.failure_kind == "measurement", result.outcome
    argv = json.loads(seen_argv.read_text())
    assert argv[0] == str(fake_vllm) and "--max-num-seqs" in argv and "3" in argv, argv
    assert result.outcome.server is not None and result.outcome.server.argv[:2] == [sys.executable, str(fake_vllm)]
    assert not pwned.exists()
    coordinator.send(Shutdown(reason="test over"))
    assert d.wait(20) == ExitCode.OK, d.log()[-3000:]
    assert os.environ.get("SERVETUNE_VLLM_LAUNCH") is None  # the flag, not the environment, chose it here


def _openai_grant(tmp_path: Path, url: str, key_env: str) -> Grant:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps({"vocab_size": 1000}))
    spec = parse_spec(textwrap.dedent(f"""
        name: keyed
        model: {{source: path, path: "{model}", served_name: fake}}
        backend: {{kind: openai, base_url: "{url}", api_key_env: {key_env}}}
        load_points:
          - {{name: one, max_concurrency: 1, num_requests: 2, input_len: 8, output_len: 4}}
        """))
    batch = plan_grid(spec).batches[0]
    return Grant(batch_id="b1", epoch=1, ttl_s=TTL_S, model=spec.model, backend=spec.backend, budgets=spec.budgets,
                 config=batch.config, trials=[GrantedTrial(trial_id=t.trial_id, attempt=1, manifest=t)
                                              for t in batch.trials])


@pytest.mark.timeout(60)
def test_an_api_key_goes_only_where_the_operator_allowed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A GRANT names an environment variable and an endpoint; without ``--api-key-env`` for that
    variable the daemon sends nothing (a hostile coordinator cannot make it post a secret anywhere)."""
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "hunter2")
    monkeypatch.setenv("MY_API_KEY", "k")
    with FakeOpenAIServer() as fake:
        sent: list[object] = []
        ctx = BatchContext(tmp_path / "work", FP, None, api_key_envs=frozenset({"MY_API_KEY"}))
        BatchRunner(ctx, sent.append, threading.Event()).run(_openai_grant(tmp_path, fake.base_url,
                                                                           "AWS_SECRET_ACCESS_KEY"))
        results = [m for m in sent if isinstance(m, Result)]
        assert results and all(r.outcome.failure_kind == "measurement" for r in results), results
        assert "start the daemon with --api-key-env AWS_SECRET_ACCESS_KEY" in (results[0].outcome.error or "")
        assert fake.requests_received == 0, "a request went out carrying a key the operator did not allow"
        sent.clear()
        BatchRunner(ctx, sent.append, threading.Event()).run(_openai_grant(tmp_path, fake.base_url, "MY_API_KEY"))
        results = [m for m in sent if isinstance(m, Result)]
        assert results and all(r.outcome.status == "ok" for r in results), results
        assert fake.requests_received >= 2


def test_a_spec_cannot_set_an_environment_that_loads_code(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    text = SPEC.format(model=tmp_path).replace("engine: {fixed: {max_num_seqs: 3}}",
                                               "engine: {fixed: {max_num_seqs: 3}, env: {LD_PRELOAD: /x.so, "
                                               "VLLM_CPU_KVCACHE_SPACE: 1}}")
    with pytest.raises(SpecError) as err:
        parse_spec(text)
    assert "engine.env: server environment variable(s) LD_PRELOAD may not come from a spec" in str(err.value)


@pytest.mark.timeout(60)
def test_a_grant_s_environment_cannot_run_a_command(tmp_path: Path) -> None:
    """``PYTHONWARNINGS`` naming a module makes Python import it at start-up, and ``antigravity``
    then opens ``BROWSER``: an environment alone runs a command. The daemon refuses the batch as a
    ``config`` failure before starting anything (the stand-in for vLLM would write ``started``)."""
    pwned, started = tmp_path / "pwned", tmp_path / "started"
    fake_vllm = tmp_path / "fake_vllm.py"
    fake_vllm.write_text(f"open({str(started)!r}, 'w')\nimport time\ntime.sleep(2)\n")
    grant = _grant(tmp_path)
    env = {"PYTHONWARNINGS": "all:0:antigravity.x:0:0", "BROWSER": f"/bin/sh -c 'touch {pwned}' #%s",
           "VLLM_CPU_KVCACHE_SPACE": "1"}
    hostile = grant.model_copy(update={"config": grant.config.model_copy(update={"env": env})})
    sent: list[object] = []
    ctx = BatchContext(tmp_path / "work", FP, None, vllm_launch=[sys.executable, str(fake_vllm)])
    BatchRunner(ctx, sent.append, threading.Event()).run(hostile)
    time.sleep(1.0)
    assert not pwned.exists() and not started.exists(), "a GRANT's environment reached a process"
    results = [m for m in sent if isinstance(m, Result)]
    assert results and all(r.outcome.failure_kind == "config" for r in results), results
    assert "BROWSER, PYTHONWARNINGS may not come from a spec" in (results[0].outcome.error or "")
