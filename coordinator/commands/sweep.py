"""``python -m coordinator sweep CONFIG``: run an experiment (validates first; writes nothing if invalid)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from coordinator.store import Store
from coordinator.sweep import SweepOptions, SweepRunner
from servetune.errors import ExperimentNotFoundError, SpecError
from servetune.paths import resolve_experiment_dir
from servetune.spec import ExperimentSpec, load_spec, parse_spec


def register(sub: Any) -> None:
    p = sub.add_parser(
        "sweep",
        help="run an experiment: a local daemon on loopback unless --no-local-daemon",
        description="Run every trial of an experiment that has no result yet (holes and transport failures).",
    )
    p.add_argument("config", help="experiment YAML, or with --resume the experiment's name or folder")
    p.add_argument("--dry-run", action="store_true", help="print the plan (configs, trials, server starts, time)")
    p.add_argument("--resume", action="store_true",
                   help="continue an experiment; CONFIG may be its name or folder (the stored spec is used)")
    p.add_argument("--retry-failed", action="store_true", help="also re-run trials whose last attempt failed")
    p.add_argument("--results-root", type=Path, default=None,
                   help="where experiments live (default $SERVETUNE_RESULTS_ROOT or ./runs)")
    p.add_argument("--bind", default="tcp://127.0.0.1:0", help="ROUTER address (default: a random loopback port)")
    p.add_argument("--no-local-daemon", action="store_true",
                   help="do not start a local daemon; wait for daemons started with `daemon start --coordinator`")
    p.set_defaults(func=run)


def _load(args: argparse.Namespace) -> tuple[ExperimentSpec, str | None]:
    path = Path(args.config)
    if path.is_file():
        return load_spec(path), path.read_text(encoding="utf-8")
    if not args.resume:
        raise SpecError(args.config, [_issue(f"file not found: {args.config} (to resume by name, add --resume)")])
    folder = resolve_experiment_dir(args.config, args.results_root)
    store = Store.open_readonly(folder)
    try:
        current = store.current_spec_hash()
        if current is None:
            raise ExperimentNotFoundError(f"experiment at {folder} has no recorded spec")
        row = store.spec(current)
    finally:
        store.close()
    import json

    text = json.dumps(row)
    return parse_spec(text, source=f"{folder} (stored spec)"), None


def _issue(message: str) -> Any:
    from servetune.errors import SpecIssue

    return SpecIssue("", message)


def run(args: argparse.Namespace) -> int:
    try:
        spec, text = _load(args)
    except SpecError as exc:
        print(exc, file=sys.stderr)
        return 2
    except ExperimentNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    options = SweepOptions(
        results_root=args.results_root,
        dry_run=args.dry_run,
        retry_failed=args.retry_failed,
        bind=args.bind,
        local_daemon=not args.no_local_daemon,
    )
    report = SweepRunner(spec, text, options).run()
    return report.exit_code
