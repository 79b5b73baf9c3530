"""The fast target: Debian's nginx on loopback serving a canned SSE completion stream.

nginx answers ``POST /v1/completions`` and ``POST /v1/chat/completions`` with the canned streams
of :mod:`.sse` as ``text/event-stream``: the bodies are static files, and since nginx's static
handler refuses POST with 405, ``error_page 405 =200 $uri`` turns the refusal into the file
(a canned body of 5 kB is too long for ``return 200 '...'``: nginx caps one config token at 4 kB).
``GET /health`` answers 200 (GuideLLM checks it); anything else is 404 (so ``vllm bench serve``
sees no ``/tokenize`` and skips its prompt re-alignment).

One worker process, its own prefix in a temporary folder, its own loopback port; the caller pins
it to a core and stops it.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from benchmarks.loadgen.procs import BenchmarkError, Child, tail
from benchmarks.loadgen.sse import chat_body, completion_body

INSTALL_HINT = "install it with: apt-get update && apt-get install -y nginx   (as root)"


def find_nginx() -> str:
    """Path of the nginx binary, or :class:`BenchmarkError` saying how to install it."""
    path = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if os.access(p, os.X_OK)), None)
    if path is None:
        raise BenchmarkError(f"nginx is not installed; {INSTALL_HINT}")
    return path


def nginx_version(nginx: str) -> str:
    out = subprocess.run([nginx, "-v"], capture_output=True, text=True, timeout=10)
    return (out.stderr or out.stdout).strip().removeprefix("nginx version: ")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def write_site(prefix: Path, port: int) -> Path:
    """Write the canned bodies and ``nginx.conf`` under ``prefix``; return the config path."""
    www = prefix / "www"
    (www / "v1" / "chat").mkdir(parents=True, exist_ok=True)
    (www / "v1" / "completions").write_bytes(completion_body())
    (www / "v1" / "chat" / "completions").write_bytes(chat_body())
    for path in (prefix, www, www / "v1", www / "v1" / "chat"):
        path.chmod(0o755)  # nginx workers run as an unprivileged user when started by root
    for path in (www / "v1" / "completions", www / "v1" / "chat" / "completions"):
        path.chmod(0o644)
    conf = prefix / "nginx.conf"
    conf.write_text(
        f"""worker_processes 1;
worker_rlimit_nofile 65536;
pid {prefix}/nginx.pid;
events {{ worker_connections 16384; }}
http {{
    access_log off;
    server_tokens off;
    sendfile on;
    tcp_nodelay on;
    etag off;
    open_file_cache max=16 inactive=3600s;
    open_file_cache_valid 3600s;
    keepalive_requests 10000000;
    keepalive_timeout 300s;
    client_body_temp_path {prefix}/client_body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
    server {{
        listen 127.0.0.1:{port} backlog=8192;
        root {www};
        location = /v1/completions {{ default_type text/event-stream; error_page 405 =200 $uri; }}
        location = /v1/chat/completions {{ default_type text/event-stream; error_page 405 =200 $uri; }}
        location = /health {{ return 200 ''; }}
        location / {{ return 404; }}
    }}
}}
"""
    )
    return conf


def nginx_argv(nginx: str, prefix: Path, conf: Path) -> list[str]:
    return [nginx, "-p", str(prefix), "-c", str(conf), "-e", str(prefix / "error.log"), "-g", "daemon off;"]


def wait_ready(base_url: str, timeout_s: float, server: Child | None = None, path: str = "/v1/completions") -> None:
    """POST to ``path`` until a whole canned stream comes back.

    Raises :class:`BenchmarkError` on timeout, or as soon as ``server`` (if given) exited.
    """
    deadline = time.monotonic() + timeout_s
    last: str = "no answer"
    while time.monotonic() < deadline:
        if server is not None and server.poll() is not None:
            raise BenchmarkError(f"{server.name} exited with {server.returncode}", tail(server.log_path))
        try:
            req = urllib.request.Request(base_url + path, data=b"{}", headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=2) as resp:
                body = resp.read()
                if resp.status == 200 and body.endswith(b"data: [DONE]\n\n"):
                    return
                last = f"HTTP {resp.status}, {len(body)} bytes"
        except (urllib.error.URLError, OSError) as err:
            last = str(err)
        time.sleep(0.1)
    raise BenchmarkError(f"target at {base_url} not ready after {timeout_s:.0f} s ({last})")
