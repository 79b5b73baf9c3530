"""``daemon keys init [--coordinator-key KEY] | show``: this node's CURVE key pair and the
coordinator key it pins, under ``$SERVETUNE_HOME`` (default ``~/.servetune``; files in
:mod:`servetune.keys`). ``show`` prints the public key to admit on the coordinator with
``python -m coordinator keys add NAME KEY``.

Exit codes: 0 done, 2 a malformed key or a missing or malformed key file (the message names it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import zmq

from servetune.exitcodes import ExitCode
from servetune.keys import (
    KeyFileError,
    daemon_dir,
    init_pair,
    load_pair,
    pinned_coordinator_key,
    save_coordinator_key,
    servetune_home,
)


def register(sub: Any) -> None:
    p = sub.add_parser("keys", help="this daemon's CURVE keys and the coordinator key it pins",
                       description="Manage this node's CURVE key pair ($SERVETUNE_HOME, default ~/.servetune). "
                                   "Exit codes: 0 done, 2 bad input.")
    p.add_argument("--home", type=Path, default=None, help="instead of $SERVETUNE_HOME")
    ks = p.add_subparsers(dest="keys_command", metavar="ACTION")
    ks.required = True
    init = ks.add_parser("init", help="make this daemon's key pair (kept if there is one)")
    init.add_argument("--coordinator-key", default=None, metavar="KEY",
                      help="pin this coordinator public key (`python -m coordinator keys show` prints it)")
    init.add_argument("--force", action="store_true", help="replace an existing pair")
    ks.add_parser("show", help="print this daemon's public key and the pinned coordinator key")


def run(args: argparse.Namespace) -> int:
    home = servetune_home(args.home)
    try:
        if args.keys_command == "init":
            pair, new = init_pair(daemon_dir(home), zmq.curve_keypair, force=args.force)
            print(f"{'made' if new else 'kept the existing'} daemon key pair in {daemon_dir(home)} "
                  f"(key id {pair.key_id}); admit it on the coordinator with:\n"
                  f"  python -m coordinator keys add NAME {pair.public}", file=sys.stderr)
            if args.coordinator_key is not None:
                path = save_coordinator_key(home, args.coordinator_key)
                print(f"pinned the coordinator key in {path}", file=sys.stderr)
            print(pair.public)
        else:
            pair = load_pair(daemon_dir(home))
            print(pair.public)
            try:
                print(f"coordinator key: {pinned_coordinator_key(home)}", file=sys.stderr)
            except KeyFileError as exc:
                print(f"coordinator key: none ({exc})", file=sys.stderr)
    except KeyFileError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    return ExitCode.OK
