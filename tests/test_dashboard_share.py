"""Sharing the dashboard safely, tested on a real ``panel serve dashboards/`` (one server start).

The server is started the way ``dashboards/README.md`` ("Sharing the dashboard") tells a team to,
with Panel's built-in login (``--basic-auth`` with a credentials file, ``--cookie-secret``), but
with NO ``--address``: so one start checks both promises.

- By default it listens on loopback only: every listening socket of its port (read from
  ``/proc/net/tcp`` and ``tcp6``) is on a loopback address, and a connection to a non-loopback
  address of this machine (where it has one) is refused.
- Without logging in, the app cannot be reached: ``GET /dashboards`` is redirected to the login
  page, and so is a request with a forged ``user`` cookie; a wrong password is sent back to the
  login page with an error and gets no session cookie; the right one gets the app's page.

No browser: the login is Panel's HTML form, posted as a browser posts it. Runtime: one server start
(about 10-20 s on 2 cores; the experiment list is empty and the warm-up is off).
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import socket
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.test_dashboard import ARTIFACTS, panel_served

USER, PASSWORD = "alice", "correct horse battery staple"


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    tmp = tmp_path_factory.mktemp("share")
    (tmp / "runs").mkdir()
    creds = tmp / "credentials.json"
    creds.write_text(json.dumps({USER: PASSWORD}), encoding="utf-8")
    creds.chmod(0o600)
    with panel_served(tmp / "runs", ARTIFACTS / "dashboard-share-server.log", address=None,
                      extra=["--basic-auth", str(creds), "--cookie-secret", "test-only-secret-" + "x" * 32],
                      env_extra={"SERVETUNE_DASHBOARD_WARM_UP_S": "0"}) as (_, port):
        yield port


def _request(port: int, method: str, path: str, body: str | None = None,
             headers: dict[str, str] | None = None) -> http.client.HTTPResponse:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request(method, path, body=body, headers=headers or {})
    resp = conn.getresponse()
    resp.body = resp.read()  # type: ignore[attr-defined]
    conn.close()
    return resp


def _cookies(resp: http.client.HTTPResponse) -> dict[str, str]:
    out = {}
    for raw in resp.headers.get_all("Set-Cookie") or []:
        name, _, rest = raw.partition("=")
        out[name.strip()] = rest.split(";", 1)[0]
    return out


def _to_login(resp: http.client.HTTPResponse) -> bool:
    """Whether ``resp`` redirects to the login page (Panel writes ``./login?next=...``)."""
    return resp.status in (302, 303) and urllib.parse.urlsplit(resp.headers.get("Location", "")).path in ("/login", "./login")


def _login(port: int, password: str) -> http.client.HTTPResponse:
    form = urllib.parse.urlencode({"username": USER, "password": password})
    return _request(port, "POST", "/login", form, {"Content-Type": "application/x-www-form-urlencoded"})


def _listening(port: int) -> list[str]:
    """The local addresses of the sockets listening on TCP ``port`` (from /proc/net/tcp, tcp6)."""
    found = []
    for name, size in (("tcp", 4), ("tcp6", 16)):
        path = Path("/proc/net") / name
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            local, st = fields[1], fields[3]
            hexaddr, hexport = local.split(":")
            if st != "0A" or int(hexport, 16) != port:  # 0A: LISTEN
                continue
            raw = bytes.fromhex(hexaddr)
            # /proc prints each 32-bit word in host (little-endian) order
            packed = b"".join(raw[i:i + 4][::-1] for i in range(0, size, 4))
            found.append(str(ipaddress.ip_address(packed)))
    return found


def _own_addresses() -> list[str]:
    """This machine's non-loopback IPv4 addresses (empty when it has none)."""
    addrs = set()
    try:
        addrs |= {info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)}
    except OSError:
        pass
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent: this only asks the routing table
            addrs.add(s.getsockname()[0])
        except OSError:
            pass
    return sorted(a for a in addrs if not ipaddress.ip_address(a).is_loopback and a != "0.0.0.0")


def test_by_default_it_listens_on_loopback_only(shared: int) -> None:
    listening = _listening(shared)
    assert listening, f"nothing listens on port {shared}"
    assert all(ipaddress.ip_address(a).is_loopback for a in listening), listening
    for addr in _own_addresses():
        with socket.socket() as s, pytest.raises(OSError):
            s.settimeout(5)
            s.connect((addr, shared))


def test_without_login_the_app_is_out_of_reach(shared: int) -> None:
    for headers in ({}, {"Cookie": f"user={USER}"}):  # no cookie, and a forged (unsigned) one
        resp = _request(shared, "GET", "/dashboards", headers=headers)
        assert _to_login(resp), (resp.status, resp.headers.items(), resp.body[:300])  # type: ignore[attr-defined]
        assert b"servetune" not in resp.body  # type: ignore[attr-defined]
    page = _request(shared, "GET", "/login")
    assert page.status == 200 and b"password" in page.body.lower()  # type: ignore[attr-defined]


def test_a_wrong_password_is_refused(shared: int) -> None:
    resp = _login(shared, PASSWORD + "!")
    assert resp.status in (302, 303) and "error=" in resp.headers["Location"], (resp.status, resp.headers.items())
    assert "user" not in _cookies(resp)
    after = _request(shared, "GET", "/dashboards",
                     headers={"Cookie": "; ".join(f"{k}={v}" for k, v in _cookies(resp).items())})
    assert _to_login(after), (after.status, after.headers.items())


def test_the_right_password_gets_the_app(shared: int) -> None:
    resp = _login(shared, PASSWORD)
    cookies = _cookies(resp)
    assert resp.status in (302, 303) and "user" in cookies, (resp.status, resp.headers.items())
    page = _request(shared, "GET", "/dashboards", headers={"Cookie": "; ".join(f"{k}={v}" for k, v in cookies.items())})
    assert page.status == 200, (page.status, page.body[:300])  # type: ignore[attr-defined]
    assert b"servetune" in page.body  # type: ignore[attr-defined]
