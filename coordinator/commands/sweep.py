"""``python -m coordinator sweep CONFIG``: run an experiment (validates first; writes nothing if invalid)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from coordinator.fleet import DEFAULT_FLEET_BIND, LOCAL_BIND, fleet_settings, merge_groups
from coordinator.planning import planner_class
from servetune.errors import ExperimentNotFoundError, SpecError, SpecIssue
from servetune.exitcodes import ExitCode
from servetune.paths import resolve_experiment_dir
from servetune.spec import ExperimentSpec, load_spec_text, parse_spec


def register(sub: Any) -> None:
    p = sub.add_parser(
        "sweep",
        help="run an experiment: a local daemon on loopback unless --no-local-daemon",
        description="Run every trial of an experiment that has no result yet (holes and transport failures).",
    )
    p.add_argument("config", help="experiment YAML, or with --resume the experiment's name or folder")
    p.add_argument("--dry-run", action="store_true", help="print the plan (configs, trials, server starts, time)")
    p.add_argument("--preview", action="store_true",
                   help="SIMULATED: run the plan on the simulated vLLM (expected winner, front, failures, server "
                        "starts, cost); starts nothing and writes nothing")
    p.add_argument("--profile", default=None, help="--preview: the simulated hardware profile (default: the spec's)")
    p.add_argument("--model-shape", default=None, help="--preview: the simulated model shape (default: the spec's)")
    p.add_argument("--json", action="store_true",
                   help="--preview: print the preview as one JSON document (coordinator/preview.schema.json)")
    p.add_argument("--resume", action="store_true",
                   help="continue an experiment; CONFIG may be its name or folder (the stored spec is used)")
    p.add_argument("--retry-failed", action="store_true", help="also re-run trials whose last attempt failed")
    p.add_argument("--results-root", type=Path, default=None,
                   help="where experiments live (default $SERVETUNE_RESULTS_ROOT or ./runs)")
    p.add_argument("--bind", default=None,
                   help="ROUTER address daemons dial (default: a random loopback port for a local sweep; "
                        f"{DEFAULT_FLEET_BIND}, every interface, with --no-local-daemon)")
    p.add_argument("--no-local-daemon", action="store_true",
                   help="do not start a local daemon; wait for daemons started with `daemon start --coordinator` "
                        "(the command to run is printed)")
    fleet = p.add_argument_group("fleet settings (coordinator settings, never part of the spec or its hash)")
    fleet.add_argument("--fleet", type=Path, default=None, metavar="FILE",
                       help="YAML file of fleet settings (keys: see coordinator/fleet.py); flags below win")
    fleet.add_argument("--heartbeat-interval", type=float, default=None, metavar="S", dest="heartbeat_interval_s",
                       help="daemon heartbeat interval (default 1 s)")
    fleet.add_argument("--lease-ttl", type=float, default=None, metavar="S", dest="lease_ttl_s",
                       help="lease lifetime after its last renewal (default 30 s)")
    fleet.add_argument("--lease-grace", type=float, default=None, metavar="S", dest="lease_grace_s",
                       help="wait past the TTL before a lost lease is re-granted with epoch + 1 (default 5 s)")
    fleet.add_argument("--daemon-wait", type=float, default=None, metavar="S", dest="daemon_wait_s",
                       help="end the sweep, listing its holes (exit code 4), after this long with no daemon "
                            "connected (default 300 s)")
    fleet.add_argument("--max-transport-retries", type=int, default=None, metavar="N", dest="max_transport_retries",
                       help="attempts of one trial lost to transport or daemon errors before it is left as a hole "
                            "(default 3)")
    p.set_defaults(func=run)


def _load(args: argparse.Namespace) -> tuple[ExperimentSpec, str | None]:
    path = Path(args.config)
    if path.exists() and not path.is_dir():
        return load_spec_text(path)  # a FIFO or a device is refused there, without blocking
    if not args.resume:
        raise SpecError(args.config, [_issue(f"file not found: {args.config} (to resume by name, add --resume)")])
    from coordinator.store import Store

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
    if (args.profile or args.model_shape or args.json) and not args.preview:
        print("error: --profile, --model-shape and --json only apply with --preview", file=sys.stderr)
        return ExitCode.USAGE
    if args.preview and args.dry_run:
        print("error: --preview and --dry-run: give one (--preview is the plan on the simulator)", file=sys.stderr)
        return ExitCode.USAGE
    try:
        spec, text = _load(args)
        if (args.dry_run or args.preview) and planner_class(spec.planner.kind).adaptive:
            mode = "--dry-run" if args.dry_run else "--preview"
            raise SpecError(args.config, [SpecIssue("planner.kind", (
                f"{spec.planner.kind!r} is an adaptive planner: it chooses each batch from the results of the "
                f"last, so {mode} cannot show its plan (it shows plans fixed in advance); run the sweep itself "
                "(backend.kind: sim simulates it), or preview a grid, random or quasi-random design"))])
        if args.preview:
            from coordinator.preview import run_preview

            return run_preview(spec, args.profile, args.model_shape, as_json=args.json)
        settings = fleet_settings(
            args.fleet, bind=args.bind, heartbeat_interval_s=args.heartbeat_interval_s, lease_ttl_s=args.lease_ttl_s,
            lease_grace_s=args.lease_grace_s, daemon_wait_s=args.daemon_wait_s,
            max_transport_retries=args.max_transport_retries,
        )
        merge_groups(settings.groups, spec.hardware.groups if spec.hardware else ())  # refused here, before any write
    except SpecError as exc:
        print(exc, file=sys.stderr)
        return ExitCode.USAGE
    except ExperimentNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    # imported here, not at the top: `python -m coordinator validate` builds this parser too, and the
    # sweep loop's modules (ZeroMQ, the control core, the artifact sink) would double its start-up
    from coordinator.sweep import SweepOptions, SweepRunner
    from coordinator.transport import BindError
    from servetune.keys import KeyFileError

    local = not args.no_local_daemon
    options = SweepOptions(
        results_root=args.results_root,
        dry_run=args.dry_run,
        retry_failed=args.retry_failed,
        bind=settings.bind or (LOCAL_BIND if local else DEFAULT_FLEET_BIND),
        local_daemon=local,
        fleet=settings,
    )
    try:
        report = SweepRunner(spec, text, options).run()
    except (BindError, KeyFileError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    except SpecError as exc:  # a spec its GRANTs could not carry (coordinator.control.check_grant_bounds)
        print(exc, file=sys.stderr)
        return ExitCode.USAGE
    return int(report.exit_code)
