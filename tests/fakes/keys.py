"""Real CURVE keys for tests and benchmarks that start ``python -m coordinator`` and ``daemon start``
processes on one host: one ``$SERVETUNE_HOME`` holding the coordinator's pair, a daemon pair admitted
in the allow-list (as ``test-daemon``), nothing pinned (a daemon on the coordinator's host pins
``coordinator/public.key`` of the same home). Not a fake of the security: the real files and checks."""

from __future__ import annotations

from pathlib import Path

import zmq

from servetune.keys import (
    KeyPair,
    add_to_allow_list,
    coordinator_dir,
    daemon_dir,
    init_pair,
    read_allow_list,
)

DAEMON_NAME = "test-daemon"


def fleet_home(home: Path) -> Path:
    """Make (or keep) the keys of a one-host fleet under ``home``; returns ``home``."""
    init_pair(coordinator_dir(home), zmq.curve_keypair)
    pair, _ = init_pair(daemon_dir(home), zmq.curve_keypair)
    if not any(e.public_key == pair.public for e in read_allow_list(home)):
        add_to_allow_list(home, DAEMON_NAME, pair.public)
    return home


def new_pair() -> KeyPair:
    public, secret = zmq.curve_keypair()
    return KeyPair(public.decode("ascii"), secret.decode("ascii"))
