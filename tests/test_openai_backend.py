"""The `openai` backend: measure an endpoint servetune did not start (here: the session's real vLLM
server, and a small in-test server that checks the API key)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web

import analysis
from daemon.server import VLLMServer
from servetune.errors import SpecError
from servetune.spec import parse_spec
from tests.conftest import cli_env, coordinator_cmd

SPEC = textwrap.dedent(
    """
    name: {name}
    model: {{source: tiny, served_name: {served}}}
    backend: {{kind: openai, base_url: "{url}"{extra}}}
    load_points:
      - {{name: c2, max_concurrency: 2, num_requests: 6, input_len: 16, output_len: 8}}
    """
)


def _spec(name: str, url: str, served: str = "tiny", extra: str = "") -> str:
    return SPEC.format(name=name, url=url, served=served, extra=extra)


def test_spec_rules_for_the_openai_backend() -> None:
    ok = parse_spec(_spec("x", "http://127.0.0.1:9"))
    assert ok.backend.kind == "openai"
    with pytest.raises(SpecError, match="backend.base_url is required"):
        parse_spec(_spec("x", "http://127.0.0.1:9").replace('base_url: "http://127.0.0.1:9"', "api_key_env: K"))
    with pytest.raises(SpecError, match="engine args and env cannot be applied"):
        parse_spec(_spec("x", "http://127.0.0.1:9") + "engine: {fixed: {max_num_seqs: 4}}\n")
    with pytest.raises(SpecError, match="backend.python is no longer a spec key"):
        parse_spec(_spec("x", "http://127.0.0.1:9", extra=", python: /usr/bin/python3"))
    with pytest.raises(SpecError, match="only apply to backend.kind 'openai'"):
        parse_spec(_spec("x", "http://127.0.0.1:9").replace("kind: openai, ", ""))


def _sweep(tmp_path: Path, text: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    spec = tmp_path / "spec.yaml"
    spec.write_text(text)
    return subprocess.run(coordinator_cmd("sweep", str(spec), "--results-root", str(tmp_path / "runs")),
                          capture_output=True, text=True, timeout=300, env=env)


@pytest.mark.vllm
def test_sweep_against_a_running_vllm(vllm_server: VLLMServer, tmp_path: Path, tiny_cache: Path) -> None:
    proc = _sweep(tmp_path, _spec("ext", vllm_server.base_url, extra=", scrape_metrics: true"), cli_env(tiny_cache))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"endpoint {vllm_server.base_url}" in proc.stdout
    ds = analysis.load("ext", results_root=tmp_path / "runs")
    assert list(ds.status.values) == ["ok"] and list(ds.backend.values) == ["openai"]
    assert int(ds.n_completed.values[0]) == 6 and int(ds.n_errors.values[0]) == 0
    # scrape_metrics: the endpoint is a vLLM, so its own counters are read and must agree
    assert float(ds.server_requests_delta.values[0]) == 6
    assert float(ds.server_generation_tokens_delta.values[0]) == 6 * 8
    assert not (tmp_path / "runs" / "ext" / "daemon" / "servers.jsonl").exists(), "no server may be started"


class KeyedServer:
    """A canned OpenAI-style streaming endpoint that requires ``Authorization: Bearer <key>``."""

    def __init__(self, key: str):
        self.key = key
        self.seen_auth: list[str | None] = []
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        auth = request.headers.get("Authorization")
        self.seen_auth.append(auth)
        if auth != f"Bearer {self.key}":
            return web.json_response({"error": {"message": "bad key"}}, status=401)
        body = await request.json()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        n = int(body["max_tokens"])
        for _ in range(n):
            chunk = {"choices": [{"index": 0, "text": "x", "finish_reason": None}]}
            await resp.write(b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n")
        usage = {"choices": [], "usage": {"prompt_tokens": len(body["prompt"]), "completion_tokens": n}}
        await resp.write(b"data: " + json.dumps(usage).encode() + b"\n\ndata: [DONE]\n\n")
        return resp

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_post("/v1/completions", self._handle)
        runner = web.AppRunner(app)
        self._loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(runner.cleanup())

    def __enter__(self) -> KeyedServer:
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


@pytest.fixture
def keyed() -> Iterator[KeyedServer]:
    with KeyedServer("s3cret") as server:
        yield server


def test_api_key_from_the_environment(keyed: KeyedServer, tmp_path: Path, tiny_cache: Path) -> None:
    url = f"http://127.0.0.1:{keyed.port}"
    env = {**cli_env(tiny_cache), "SERVETUNE_TEST_KEY": "s3cret"}
    proc = _sweep(tmp_path / "a", _spec("keyed", url, served="any", extra=", api_key_env: SERVETUNE_TEST_KEY"), env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ds = analysis.load("keyed", results_root=tmp_path / "a" / "runs")
    assert list(ds.status.values) == ["ok"] and int(ds.n_completed.values[0]) == 6
    assert keyed.seen_auth and set(keyed.seen_auth) == {"Bearer s3cret"}

    env.pop("SERVETUNE_TEST_KEY")
    proc = _sweep(tmp_path / "b", _spec("keyed", url, served="any", extra=", api_key_env: SERVETUNE_TEST_KEY"), env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ds = analysis.load("keyed", results_root=tmp_path / "b" / "runs")
    assert list(ds.status.values) == ["failed"] and list(ds.failure_kind.values) == ["measurement"]
    assert "SERVETUNE_TEST_KEY" in str(ds.error.values[0])

    env["SERVETUNE_TEST_KEY"] = "wrong"
    proc = _sweep(tmp_path / "c", _spec("keyed", url, served="any", extra=", api_key_env: SERVETUNE_TEST_KEY"), env)
    assert proc.returncode == 0
    ds = analysis.load("keyed", results_root=tmp_path / "c" / "runs")
    assert int(ds.n_errors.values[0]) == 6 and int(ds.n_completed.values[0]) == 0
    assert os.environ.get("SERVETUNE_TEST_KEY") is None
