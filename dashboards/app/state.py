"""What the dashboard reads: experiments under the results root, their datasets, their live state.

Everything here is read-only. An experiment is a folder under the results root
(:func:`servetune.paths.results_root`) holding ``experiment.sqlite`` (a sweep's store), or only a
``results.nc`` (a dataset copied out of its experiment, or a synthetic one): both are listed; the
pages that need per-trial artifacts (the trial inspector, live status) say so when there is no store.
The store is opened read-only (``mode=ro``) straight from SQLite: the dashboard never imports the
coordinator. A dataset's version is its ``results.nc`` modification time (the coordinator rewrites
it atomically after each result); datasets, trial tables and analysis results are cached per version
and shared by every browser session of the server process.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pandas as pd
import xarray as xr

import analysis
from analysis.frame import Parameter, parameters
from servetune.artifact_index import attempt_artifacts, read_text
from servetune.errors import ServetuneError
from servetune.paths import results_root
from servetune.schema import DATASET_FILE, DB_FILE

log = logging.getLogger(__name__)

T = TypeVar("T")

#: background work (analyses, rankings): small, so heavy computations queue rather than starve the server
_EXECUTOR = ThreadPoolExecutor(max_workers=2, thread_name_prefix="dashboard")
_LOCK = threading.Lock()
_CACHE: dict[tuple[Any, ...], Future[Any]] = {}
_FUTURES: dict[tuple[Any, ...], Future[Any]] = {}
_MAX_ENTRIES = 256


def root() -> Path:
    """The results root, resolved the way the CLI resolves it (``$SERVETUNE_RESULTS_ROOT`` or ``./runs``)."""
    return results_root()


def version(folder: Path) -> int:
    """The dataset version of an experiment: its ``results.nc`` mtime in ns (0 when absent)."""
    try:
        return (folder / DATASET_FILE).stat().st_mtime_ns
    except OSError:
        return 0


def store_version(folder: Path) -> int:
    """Changes whenever the store changes (SQLite file or its write-ahead log)."""
    stamp = 0
    for name in (DB_FILE, DB_FILE + "-wal"):
        try:
            stamp = max(stamp, (folder / name).stat().st_mtime_ns)
        except OSError:
            pass
    return stamp


def _cached(key: tuple[Any, ...], make: Callable[[], T]) -> T:
    """``make()`` once per ``key`` (``(kind, folder, version, ...)``) across sessions and threads:
    concurrent callers wait for the first one; older versions of the same kind and folder are dropped."""
    with _LOCK:
        fut = _CACHE.get(key)
        owner = fut is None
        if owner:
            for k in [k for k in _CACHE if k[:2] == key[:2] and k[2:3] != key[2:3]]:
                del _CACHE[k]
            if len(_CACHE) >= _MAX_ENTRIES:
                _CACHE.clear()
            fut = Future()
            _CACHE[key] = fut
    assert fut is not None
    if owner:
        try:
            fut.set_result(make())
        except BaseException as exc:
            with _LOCK:
                _CACHE.pop(key, None)
            fut.set_exception(exc)
            raise
    return fut.result()  # type: ignore[no-any-return]


def background(key: tuple[Any, ...], fn: Callable[[], T]) -> Future[T]:
    """Run ``fn`` once per ``key`` in the background pool; every caller with the same key (any
    session) gets the same future. Keys must include the dataset version."""
    with _LOCK:
        fut = _FUTURES.get(key)
        if fut is None or (fut.done() and fut.exception() is not None and fut.cancelled()):
            if len(_FUTURES) >= _MAX_ENTRIES:
                for k in [k for k, f in _FUTURES.items() if f.done()]:
                    del _FUTURES[k]
            fut = _EXECUTOR.submit(fn)
            _FUTURES[key] = fut
    return fut


# ---------------------------------------------------------------------------------------- experiments


@dataclass(frozen=True)
class ExperimentInfo:
    """One experiment folder: ``counts`` of trials by status (``ok``/``failed``/``hole``, plus
    ``running`` from the store), when it was created, its design, and whether a sweep is running."""

    name: str
    folder: Path
    has_store: bool
    has_dataset: bool
    counts: dict[str, int]
    created_us: int
    design: str
    running: bool
    synthetic: bool
    version: int


#: experiment folders whose files could not be read: folder -> ((dataset version, store version), error)
_UNREADABLE: dict[Path, tuple[tuple[int, int], str]] = {}


def list_experiments(base: Path | None = None) -> list[ExperimentInfo]:
    """Every experiment under the results root (folders with ``experiment.sqlite`` or ``results.nc``).

    A folder whose files cannot be read (a foreign or broken file) is left out, logged once per
    version of its files, and listed by :func:`unreadable`."""
    base = base or root()
    out: list[ExperimentInfo] = []
    try:
        entries = sorted(p for p in base.iterdir() if p.is_dir())
    except OSError:
        return out
    for folder in entries:
        has_store = (folder / DB_FILE).exists()
        has_dataset = (folder / DATASET_FILE).exists()
        if not (has_store or has_dataset):
            _UNREADABLE.pop(folder, None)
            continue
        try:
            info = _info(folder, has_store, has_dataset)
            out.append(info)
            _UNREADABLE.pop(folder, None)
            warm(info)
        except Exception as exc:  # a half-written or foreign file must not break the listing
            key = (version(folder), store_version(folder))
            if _UNREADABLE.get(folder, (None,))[0] != key:
                log.warning("cannot read experiment %s: %s", folder, exc)
            _UNREADABLE[folder] = (key, f"{type(exc).__name__}: {exc}")
    return out


def unreadable(base: Path | None = None) -> dict[str, str]:
    """Experiment folders under the results root that :func:`list_experiments` left out, as of its
    last call: name -> why."""
    base = base or root()
    return {folder.name: err for folder, (_, err) in sorted(_UNREADABLE.items()) if folder.parent == base}


def _info(folder: Path, has_store: bool, has_dataset: bool) -> ExperimentInfo:
    v, sv = version(folder), store_version(folder)
    return _cached(("info", str(folder), v, sv), lambda: _read_info(folder, has_store, has_dataset, v))


def _read_info(folder: Path, has_store: bool, has_dataset: bool, v: int) -> ExperimentInfo:
    counts: dict[str, int] = {"ok": 0, "failed": 0, "hole": 0}
    created, design, synthetic, running = 0, "", False, False
    if has_dataset:
        # h5py straight: xarray decodes every coordinate on open (seconds for 100k trials), the
        # listing needs only the status column and a few attributes
        import h5py

        with h5py.File(folder / DATASET_FILE, "r") as f:
            raw = f["status"][:]
            if raw.ndim == 2:  # a netCDF char array (servetune.netcdf's fixed-width layout): one row per trial
                raw = raw.view(f"S{raw.shape[1]}").ravel() if raw.shape[1] else np.full(raw.shape[0], b"")
            status = pd.Series(raw).map(lambda b: b.decode() if isinstance(b, bytes) else str(b))
            for k, n in status.value_counts().items():
                counts[str(k)] = int(n)
            attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
        created = int(attrs.get("created_at_us", 0) or 0)
        design = str(attrs.get("design", "") or "")
        synthetic = bool(int(attrs.get("synthetic", 0) or 0))
    if has_store:
        live = live_status(folder)
        running = live.sweep_running
        counts["running"] = live.states.get("running", 0)
        if not has_dataset:
            counts.update({k: live.states.get(k, 0) for k in ("ok", "failed")})
            counts["hole"] = live.states.get("pending", 0)
        # the store's first spec is when the experiment was created; the dataset's created_at_us is
        # stamped on every rewrite of results.nc (the last update)
        created = live.created_us or created
        design = design or live.design
    return ExperimentInfo(folder.name, folder, has_store, has_dataset, counts, created, design, running, synthetic, v)


def warm(info: ExperimentInfo) -> Future[None] | None:
    """Load the dataset and trial table of a new dataset version in the background (and the default
    Pareto front of large ones), so that the first page visit finds them in memory. Returns the
    warm-up's future (one per dataset version, shared by every caller), None without a dataset."""
    if not info.has_dataset:
        return None

    def work() -> None:
        from dashboards.app.marks import drift_marks

        table(info.folder)
        swept(info.folder)
        drift_marks(info.folder)  # every page's banner reads it
        if len(table(info.folder)) > WARM_FRONT_ABOVE:
            from dashboards.app.pareto import default_front

            default_front(info.folder)

    return background(("warm", str(info.folder), info.version), work)


def warm_all(base: Path | None = None) -> list[tuple[str, Future[None]]]:
    """Start the warm-up (:func:`warm`) of every experiment under the results root; returns each
    experiment's name and warm-up future (the dashboard's server hook calls this at start-up)."""
    out: list[tuple[str, Future[None]]] = []
    for info in list_experiments(base):  # list_experiments already starts each warm-up; this gets the futures
        fut = warm(info)
        if fut is not None:
            out.append((info.name, fut))
    return out


#: trials above which the default Pareto front is precomputed when a dataset version lands
WARM_FRONT_ABOVE = 20_000


def is_synthetic(folder: Path) -> bool:
    """Whether the experiment's dataset says its data was generated (its ``synthetic`` attribute,
    the mark :func:`analysis.report.summary` and the report read)."""
    if not (folder / DATASET_FILE).exists():
        return False
    return _info(folder, (folder / DB_FILE).exists(), True).synthetic


def find(name: str, base: Path | None = None) -> Path | None:
    """The folder of experiment ``name`` under the results root, if it is one."""
    folder = (base or root()) / name
    if (folder / DB_FILE).exists() or (folder / DATASET_FILE).exists():
        return folder
    return None


# ---------------------------------------------------------------------------------------- datasets


def dataset(folder: Path) -> xr.Dataset:
    """The experiment's dataset (``analysis.load`` of its ``results.nc``), cached per version."""
    v = version(folder)
    return _cached(("ds", str(folder), v), lambda: analysis.load(folder / DATASET_FILE))


def table(folder: Path) -> pd.DataFrame:
    """``ds.sweep.table()`` of the experiment, cached per version (never modify it in place)."""
    v = version(folder)
    return _cached(("table", str(folder), v), lambda: dataset(folder).sweep.table())


def swept(folder: Path) -> list[Parameter]:
    """``analysis.frame.parameters`` of the experiment (the swept parameters), cached per version."""
    v = version(folder)
    return _cached(("swept", str(folder), v), lambda: parameters(dataset(folder)))


# ---------------------------------------------------------------------------------------- the store


def _connect(folder: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(f"file:{folder / DB_FILE}?mode=ro", uri=True, timeout=10)
    conn.row_factory = sqlite3.Row
    return conn


@dataclass(frozen=True)
class DaemonState:
    """A daemon as the store saw it: its id, hardware class, fingerprint summary, state, last word."""

    daemon_id: str
    hardware_class: str
    fingerprint: str
    state: str
    last_phase: str
    last_seen_us: int
    attempts: int


@dataclass(frozen=True)
class LiveStatus:
    """A sweep's state from its store: trials of the current spec by state (``ok``, ``failed``,
    ``running``, ``pending``), daemons, the running sweep's start, and an ETA (None when unknown)."""

    states: dict[str, int]
    planned: int
    daemons: list[DaemonState]
    sweep_running: bool
    sweep_started_us: int
    eta_s: float | None
    created_us: int
    design: str
    mean_trial_s: float | None = None
    notes: list[str] = field(default_factory=list)
    #: The latest sweep's schedule state (the store's ``schedule`` table, as ``schedule.json`` has it;
    #: ``coordinator.schedule``): key -> value, e.g. ``policy``, ``daemon:<id>``, ``drained:<class>``,
    #: ``retries``, ``clock_offsets``. Empty for a store written before it existed.
    schedule: dict[str, Any] = field(default_factory=dict)


def live_status(folder: Path) -> LiveStatus:
    """Trials by state, daemons and progress of the experiment's current spec (read-only)."""
    sv = store_version(folder)
    return _cached(("live", str(folder), sv), lambda: _read_live(folder))


def _read_live(folder: Path) -> LiveStatus:
    conn = _connect(folder)
    try:
        spec = conn.execute("SELECT spec_hash, created_at_us, design FROM specs ORDER BY created_at_us DESC LIMIT 1"
                            ).fetchone()
        first = conn.execute("SELECT MIN(created_at_us) FROM specs").fetchone()
        planned_ids = [r[0] for r in conn.execute("SELECT trial_id FROM spec_trials WHERE spec_hash=?",
                                                  (spec["spec_hash"],))] if spec else []
        attempts = conn.execute("SELECT trial_id, attempt, status, daemon_id, batch_id, hardware_class, "
                                "started_at_us, finished_at_us, result_path FROM attempts ORDER BY trial_id, attempt"
                                ).fetchall()
        sweep = conn.execute("SELECT status, started_at_us FROM sweeps ORDER BY id DESC LIMIT 1").fetchone()
        last_phase = {r["batch_id"]: (r["phase"], r["at_us"]) for r in conn.execute(
            "SELECT batch_id, phase, at_us FROM transitions WHERE id IN (SELECT MAX(id) FROM transitions "
            "GROUP BY batch_id)")}
        try:
            schedule = {r["key"]: json.loads(r["value_json"]) for r in conn.execute("SELECT key, value_json FROM schedule")}
        except sqlite3.OperationalError:  # an older store: no schedule table
            schedule = {}
    finally:
        conn.close()
    latest: dict[str, sqlite3.Row] = {}
    for a in attempts:
        latest[a["trial_id"]] = a  # ordered by attempt: the last one wins
    states = {"ok": 0, "failed": 0, "running": 0, "pending": 0}
    for tid in planned_ids:
        row = latest.get(tid)
        st = row["status"] if row is not None else "pending"
        states[st if st in states else "pending"] += 1
    running = bool(sweep is not None and sweep["status"] == "running")
    durations = [(a["finished_at_us"] - a["started_at_us"]) / 1e6 for a in attempts
                 if a["finished_at_us"] and a["status"] in ("ok", "failed")]
    mean_s = sum(durations) / len(durations) if durations else None
    eta = None
    if running and sweep is not None:
        done_now = [a for a in attempts if a["finished_at_us"] and a["finished_at_us"] >= sweep["started_at_us"]]
        left = states["pending"] + states["running"]
        if done_now:
            elapsed = max(1e-6, time.time() - sweep["started_at_us"] / 1e6)
            eta = elapsed / len(done_now) * left
        elif mean_s is not None:
            eta = mean_s * left
    daemons = _daemons(folder, attempts, last_phase, running)
    return LiveStatus(states, len(planned_ids), daemons, running, int(sweep["started_at_us"]) if sweep else 0, eta,
                      int(first[0] or 0) if first else 0, str(spec["design"] or "") if spec else "", mean_s,
                      schedule=schedule)


def _daemons(folder: Path, attempts: list[sqlite3.Row], last_phase: dict[str, tuple[str, int]],
             sweep_running: bool) -> list[DaemonState]:
    by: dict[str, list[sqlite3.Row]] = {}
    for a in attempts:
        if a["daemon_id"]:
            by.setdefault(a["daemon_id"], []).append(a)
    out = []
    for did, rows in sorted(by.items()):
        hw = next((r["hardware_class"] for r in reversed(rows) if r["hardware_class"]), "") or ""
        fp = ""
        for r in reversed(rows):
            if r["result_path"]:
                fp = _fingerprint_summary(folder / r["result_path"])
                if fp:
                    break
        phases = [last_phase[r["batch_id"]] for r in rows if r["batch_id"] in last_phase]
        phase, seen = max(phases, key=lambda p: p[1]) if phases else ("", 0)
        busy = any(r["status"] == "running" for r in rows)
        state = "busy" if busy and sweep_running else ("idle" if sweep_running else "gone")
        out.append(DaemonState(did, hw, fp, state, phase, seen, len(rows)))
    return out


def _fingerprint_summary(path: Path) -> str:
    try:
        fp = json.loads(path.read_text(encoding="utf-8"))["outcome"].get("fingerprint") or {}
    except (OSError, ValueError, KeyError):
        return ""
    gpus = ", ".join(g.get("name", "?") for g in fp.get("gpus", [])) or "no GPU"
    return (f"{fp.get('hostname', '?')}: {fp.get('cpu_model', '?')} ({fp.get('cpu_count', '?')} cores, "
            f"{fp.get('cpu_isa', '?')}), {fp.get('ram_gib', '?')} GiB, {gpus}; vLLM {fp.get('vllm_version')}, "
            f"torch {fp.get('torch_version')}")


# ---------------------------------------------------------------------------------------- one trial


@dataclass(frozen=True)
class TrialFiles:
    """A trial's artifacts: its manifest, its latest finished attempt's record (result JSON), and
    its logs (the vLLM server log; the daemon log lines of the attempt's time window): from the
    experiment's artifact store (:mod:`servetune.artifact_index`) when it holds them, else from
    the files a local daemon left under the experiment folder."""

    manifest: dict[str, Any] | None
    record: dict[str, Any] | None
    server_log: str
    server_log_path: str
    client_log: str
    client_log_path: str


def trial_files(folder: Path, trial_id: str, max_chars: int = 60_000) -> TrialFiles:
    """Read what the store and the daemon wrote for ``trial_id`` (empty parts say why)."""
    if not (folder / DB_FILE).exists():
        why = "this experiment has no store (only results.nc): no manifest, per-request samples or logs"
        return TrialFiles(None, None, why, "", why, "")
    conn = _connect(folder)
    try:
        m = conn.execute("SELECT manifest_json FROM trials WHERE trial_id=?", (trial_id,)).fetchone()
        row = conn.execute("SELECT attempt, result_path, started_at_us, finished_at_us, batch_id FROM attempts "
                           "WHERE trial_id=? AND status IN ('ok','failed') ORDER BY attempt DESC LIMIT 1",
                           (trial_id,)).fetchone()
    finally:
        conn.close()
    manifest = json.loads(m[0]) if m else None
    if row is None or not row["result_path"]:
        return TrialFiles(manifest, None, "no finished attempt yet", "", "no finished attempt yet", "")
    record = json.loads((folder / row["result_path"]).read_text(encoding="utf-8"))
    server = (record.get("outcome") or {}).get("server") or {}
    stored = _stored_logs(folder, trial_id, row["attempt"], max_chars)
    slog, spath = stored.get("server_log") or _server_log(folder, server.get("log_path"), row["batch_id"], max_chars)
    clog, cpath = stored.get("client_log") or _client_log(folder, row["started_at_us"], row["finished_at_us"],
                                                          max_chars)
    return TrialFiles(manifest, record, slog, spath, clog, cpath)


def _stored_logs(folder: Path, trial_id: str, attempt: int, max_chars: int) -> dict[str, tuple[str, str]]:
    """The attempt's logs from the experiment's artifact store (uploaded by local and remote
    daemons alike), by kind: ``(text, where)``. A log the store has no verified copy of is left
    out (the caller falls back to the files on this machine); one that fails verification is
    logged and left out too."""
    out: dict[str, tuple[str, str]] = {}
    for rec in attempt_artifacts(folder, trial_id, attempt):
        if rec.kind in ("server_log", "client_log") and rec.kind not in out:
            try:
                text = read_text(folder, rec, max_chars)
            except ServetuneError as exc:
                log.warning("stored %s of trial %s attempt %d is unreadable: %s", rec.name, trial_id[:12], attempt, exc)
                continue
            out[rec.kind] = (text, f"artifact store: {rec.name} ({rec.size} bytes, sha256 {rec.sha256[:12]}, "
                                   f"from {rec.daemon or 'a daemon'})")
    return out


def _tail(text: str, max_chars: int) -> str:
    return text if len(text) <= max_chars else "... (earlier lines cut)\n" + text[-max_chars:]


def _server_log(folder: Path, logged: str | None, batch_id: str, max_chars: int) -> tuple[str, str]:
    logs = folder / "daemon" / "logs"
    candidates: list[Path] = []
    if logged:
        p = Path(logged)
        candidates += [p, logs / p.name] if p.is_absolute() else [logs / p.name, p]
    if batch_id and logs.is_dir():
        candidates += sorted(logs.glob(f"server-{batch_id}-*.log"))
    for c in candidates:
        if c.is_file():
            return _tail(c.read_text(encoding="utf-8", errors="replace"), max_chars), str(c)
    return (f"no server log found (looked for {', '.join(str(c) for c in candidates) or 'nothing recorded'}; "
            "a remote daemon keeps its logs on its node)"), ""


def _client_log(folder: Path, start_us: int, end_us: int | None, max_chars: int) -> tuple[str, str]:
    """The daemon log lines (load generator, server lifecycle) stamped within the attempt's window."""
    logs = sorted((folder / "logs").glob("daemon-*.log")) if (folder / "logs").is_dir() else []
    if not logs:
        return "no daemon log under this experiment's logs/ (a remote daemon keeps its log on its node)", ""
    lo = start_us / 1e6 - 1.0
    hi = (end_us or int(time.time() * 1e6)) / 1e6 + 1.0
    picked: list[str] = []
    for path in logs:
        keep = False
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            stamp = _stamp(line)
            if stamp is not None:
                keep = lo <= stamp <= hi
            if keep:
                picked.append(line)
    if not picked:
        return f"no daemon log line falls within this attempt's window ({', '.join(str(p) for p in logs)})", str(logs[-1])
    return _tail("\n".join(picked), max_chars), ", ".join(str(p) for p in logs)


def _stamp(line: str) -> float | None:
    """Seconds since the epoch of a ``YYYY-mm-dd HH:MM:SS,mmm`` log line (local time), else None."""
    if len(line) < 23 or line[4] != "-" or line[19] != ",":
        return None
    try:
        t = time.mktime(time.strptime(line[:19], "%Y-%m-%d %H:%M:%S"))
        return t + int(line[20:23]) / 1000.0
    except ValueError:
        return None


def serve_command(folder: Path, ds: xr.Dataset, df: pd.DataFrame, config_id: str) -> str:
    """The ``vllm serve`` command (with provenance comments) of ``config_id``
    (:func:`servetune.export.serve_command`): its engine config from a trial manifest in the store,
    else rebuilt from the dataset's ``param_*`` values (a dataset without a store)."""
    from servetune.export import engine_config_from_params, model_argument
    from servetune.export import serve_command as render
    from servetune.manifest import EngineConfig

    rows = df[df["config_id"].astype(str) == config_id]
    if rows.empty:
        raise KeyError(f"no trial of config {config_id!r}")
    config = None
    if (folder / DB_FILE).exists():
        conn = _connect(folder)
        try:
            m = conn.execute("SELECT manifest_json FROM trials WHERE config_id=? LIMIT 1", (config_id,)).fetchone()
        finally:
            conn.close()
        if m:
            config = EngineConfig.model_validate(json.loads(m[0])["engine"])
    if config is None:
        params = {str(c).removeprefix("param_"): rows[c].iloc[0] for c in df.columns if str(c).startswith("param_")}
        config = engine_config_from_params(params)
    raw = str(ds.attrs.get("model", "") or "")
    try:
        identity = json.loads(raw) if raw else {}
    except ValueError:
        identity = {}
    provenance = {"experiment": ds.attrs.get("experiment", ""), "config": config_id[:16],
                  "spec": str(ds.attrs.get("spec_hash", ""))[:12]}
    from servetune.simulated import export_provenance

    provenance = export_provenance(provenance, rows["hardware_class"].tolist() if "hardware_class" in rows else [],
                                   rows["backend"].tolist() if "backend" in rows else [])
    cmd = render(config, model_argument(identity if isinstance(identity, dict) else {}), provenance=provenance)
    return cmd.text()
