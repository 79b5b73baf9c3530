"""``python -m coordinator keys init|show|add NAME KEY|list|remove NAME``: the coordinator's CURVE key
pair and the allow-list of daemon keys, under ``$SERVETUNE_HOME`` (default ``~/.servetune``; files
in :mod:`servetune.keys`). A running sweep re-reads the allow-list within a second or so: ``add``
admits a daemon, ``remove`` cuts its live session and fences its leases.

Exit codes: 0 done, 2 a bad name or key, a missing or malformed key file (the message names it).
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
    add_to_allow_list,
    allow_path,
    coordinator_dir,
    init_pair,
    key_id,
    load_pair,
    read_allow_list,
    remove_from_allow_list,
    servetune_home,
)


def register(sub: Any) -> None:
    p = sub.add_parser("keys", help="the coordinator's CURVE keys and the allow-list of daemon keys",
                       description="Manage the coordinator's CURVE key pair and the daemons it admits "
                                   "($SERVETUNE_HOME, default ~/.servetune). Exit codes: 0 done, 2 bad input.")
    p.add_argument("--home", type=Path, default=None, help="instead of $SERVETUNE_HOME")
    ks = p.add_subparsers(dest="keys_command", metavar="ACTION")
    ks.required = True
    init = ks.add_parser("init", help="make the coordinator's key pair (kept if there is one)")
    init.add_argument("--force", action="store_true", help="replace an existing pair (every daemon must re-pin)")
    ks.add_parser("show", help="print the coordinator's public key (what daemons pin)")
    add = ks.add_parser("add", help="admit a daemon's public key under NAME")
    add.add_argument("name")
    add.add_argument("key", help="the daemon's public key, as `daemon keys show` prints it")
    ks.add_parser("list", help="the admitted daemons: name, key id, public key")
    rm = ks.add_parser("remove", help="stop admitting daemon NAME (a running sweep cuts its session)")
    rm.add_argument("name")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    home = servetune_home(args.home)
    try:
        return _run(args, home)
    except KeyFileError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.USAGE


def _run(args: argparse.Namespace, home: Path) -> int:
    folder = coordinator_dir(home)
    action = args.keys_command
    if action == "init":
        pair, new = init_pair(folder, zmq.curve_keypair, force=args.force)
        print(f"{'made' if new else 'kept the existing'} coordinator key pair in {folder} (key id {pair.key_id})",
              file=sys.stderr)
        print(pair.public)
    elif action == "show":
        print(load_pair(folder).public)
    elif action == "add":
        entry = add_to_allow_list(home, args.name, args.key)
        print(f"admitted {entry.name} (key id {entry.key_id}) in {allow_path(home)}")
    elif action == "list":
        entries = read_allow_list(home)
        if not entries:
            print(f"no daemons admitted ({allow_path(home)}); add one with `python -m coordinator keys add NAME KEY`",
                  file=sys.stderr)
        for e in entries:
            print(f"{e.name}\t{key_id(e.public_key)}\t{e.public_key}")
    elif action == "remove":
        entry = remove_from_allow_list(home, args.name)
        print(f"removed {entry.name} (key id {entry.key_id}); a running sweep cuts its session")
    return ExitCode.OK
