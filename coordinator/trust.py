"""The keys one sweep runs with: the coordinator's CURVE pair, the gate of admitted daemon keys, and a
local sweep's throwaway keys for its child daemon.

- The coordinator's pair is ``$SERVETUNE_HOME/coordinator/`` (``python -m coordinator keys init``).
  A local sweep without one makes a throwaway pair in memory, so the quick start needs no setup;
  a fleet sweep (``--no-local-daemon``) without one is a usage error saying what to run.
- Admitted daemons: the allow-list ``$SERVETUNE_HOME/coordinator/daemons.allow``, re-read while the
  sweep runs, plus the child daemon's throwaway key (admitted in memory as ``local-daemon``).
- The child daemon gets its own pair and the coordinator's public key in a private temporary
  ``$SERVETUNE_HOME`` (folder mode 0700, secret mode 0600), removed when the sweep ends.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import zmq

from coordinator.zap import KeyGate
from servetune.keys import (
    SECRET_FILE,
    KeyFileError,
    KeyPair,
    coordinator_dir,
    daemon_dir,
    generate,
    load_pair,
    save_coordinator_key,
    save_pair,
)

LOCAL_DAEMON_NAME = "local-daemon"


@dataclass
class SweepKeys:
    server: KeyPair
    gate: KeyGate
    #: The child daemon's ``$SERVETUNE_HOME`` (None: no local daemon).
    child_home: Path | None = None

    def cleanup(self) -> None:
        if self.child_home is not None:
            shutil.rmtree(self.child_home, ignore_errors=True)
            self.child_home = None


def sweep_keys(home: Path, local_daemon: bool) -> SweepKeys:
    """The keys of one sweep (see the module docstring); :class:`KeyFileError` if a fleet sweep has
    no coordinator keys or a key file is malformed."""
    folder = coordinator_dir(home)
    if (folder / SECRET_FILE).exists():
        server = load_pair(folder)
    elif local_daemon:
        server = generate(zmq.curve_keypair)
    else:
        raise KeyFileError(f"no coordinator keys in {folder}: run `python -m coordinator keys init`, then admit "
                           "each daemon with `python -m coordinator keys add NAME KEY` (README: Setting up keys "
                           "for a fleet)")
    if not local_daemon:
        return SweepKeys(server, KeyGate(home))
    child = generate(zmq.curve_keypair)
    child_home = Path(tempfile.mkdtemp(prefix="servetune-keys-"))
    try:
        save_pair(daemon_dir(child_home), child)
        save_coordinator_key(child_home, server.public)
    except BaseException:
        shutil.rmtree(child_home, ignore_errors=True)
        raise
    return SweepKeys(server, KeyGate(home, extra={child.public: LOCAL_DAEMON_NAME}), child_home)
