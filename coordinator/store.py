"""The experiment store: SQLite (WAL) metadata plus one immutable JSON file per finished attempt.

Layout of an experiment folder (``<results root>/<name>/``)::

    experiment.sqlite          specs, trials, attempts, state transitions, sweeps
    results/<trial_id>/attempt-<n>.json   one per finished attempt (manifest, outcome, metrics)
    results.nc                 the consolidated xarray dataset (written by coordinator.dataset)

Contract:

- One coordinator process owns a store at a time (it is the single writer); readers (analysis,
  dashboards) open the SQLite file read-only or read ``results.nc``.
- Nothing measured is overwritten: every attempt is its own row and its own file; a result file
  is created with an exclusive link and a second write to the same attempt raises.
- Attempts move ``running -> ok | failed`` exactly once. A ``running`` attempt left behind by a
  coordinator that died is closed as a ``transport`` failure when the store is next opened for a
  sweep (:meth:`Store.close_abandoned`).
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servetune.canonical import canonical_json
from servetune.errors import ServetuneError
from servetune.manifest import Plan, TrialManifest
from servetune.schema import DB_FILE
from servetune.states import check_attempt

log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS specs (
    spec_hash TEXT PRIMARY KEY, spec_json TEXT NOT NULL, source_text TEXT, created_at_us INTEGER NOT NULL,
    design TEXT, randomized INTEGER, planner_seed INTEGER
);
CREATE TABLE IF NOT EXISTS trials (
    trial_id TEXT PRIMARY KEY, manifest_json TEXT NOT NULL, config_id TEXT NOT NULL, load_point TEXT NOT NULL,
    repeat INTEGER NOT NULL, baseline_run INTEGER, first_spec_hash TEXT NOT NULL, created_at_us INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS spec_trials (
    spec_hash TEXT NOT NULL, trial_id TEXT NOT NULL, run_order INTEGER NOT NULL, batch_index INTEGER NOT NULL,
    PRIMARY KEY (spec_hash, trial_id)
);
CREATE TABLE IF NOT EXISTS attempts (
    trial_id TEXT NOT NULL, attempt INTEGER NOT NULL, status TEXT NOT NULL, failure_kind TEXT, error TEXT,
    daemon_id TEXT, batch_id TEXT, spec_hash TEXT, started_at_us INTEGER NOT NULL, finished_at_us INTEGER,
    submission_id TEXT, result_path TEXT, metrics_json TEXT, hardware_class TEXT, daemon_key_id TEXT,
    PRIMARY KEY (trial_id, attempt)
);
CREATE TABLE IF NOT EXISTS transitions (
    id INTEGER PRIMARY KEY AUTOINCREMENT, trial_id TEXT, attempt INTEGER, batch_id TEXT, at_us INTEGER NOT NULL,
    phase TEXT NOT NULL, detail TEXT
);
CREATE TABLE IF NOT EXISTS sweeps (
    id INTEGER PRIMARY KEY AUTOINCREMENT, spec_hash TEXT NOT NULL, started_at_us INTEGER NOT NULL,
    finished_at_us INTEGER, status TEXT NOT NULL, detail TEXT
);
"""


def now_us() -> int:
    return time.time_ns() // 1000


class StoreError(ServetuneError):
    """The store refused an operation that would lose or overwrite a measurement."""


@dataclass(frozen=True)
class AttemptRow:
    trial_id: str
    attempt: int
    status: str
    failure_kind: str | None
    error: str | None
    started_at_us: int
    finished_at_us: int | None
    result_path: str | None
    metrics: dict[str, Any] | None
    hardware_class: str | None
    submission_id: str | None
    #: :func:`servetune.keys.key_id` of the CURVE key of the daemon it was granted to (None: older stores).
    daemon_key_id: str | None = None


class Store:
    """SQLite metadata of one experiment. Not thread-safe: use it from the coordinator's thread."""

    def __init__(self, folder: Path, conn: sqlite3.Connection):
        self.folder = folder
        self._conn = conn

    # ------------------------------------------------------------------ lifecycle

    @classmethod
    def open(cls, folder: str | os.PathLike[str], *, create: bool = True) -> Store:
        """Open (and with ``create``, make) the store in ``folder``."""
        path = Path(folder)
        db = path / DB_FILE
        if not db.exists() and not create:
            raise StoreError(f"no experiment store at {db}")
        path.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(db, timeout=30.0, isolation_level=None)
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.executescript(_SCHEMA)
        _migrate(conn)
        return cls(path, conn)

    @classmethod
    def open_readonly(cls, folder: str | os.PathLike[str]) -> Store:
        db = Path(folder) / DB_FILE
        if not db.exists():
            raise StoreError(f"no experiment store at {db}")
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30.0, isolation_level=None)
        conn.row_factory = sqlite3.Row
        return cls(Path(folder), conn)

    def close(self) -> None:
        self._conn.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            yield self._conn
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        self._conn.execute("COMMIT")

    # ------------------------------------------------------------------ specs and plans

    def latest_spec(self) -> tuple[str, dict[str, Any]] | None:
        row = self._conn.execute(
            "SELECT spec_hash, spec_json FROM specs ORDER BY created_at_us DESC, rowid DESC LIMIT 1"
        ).fetchone()
        return (row["spec_hash"], json.loads(row["spec_json"])) if row else None

    def current_spec_hash(self) -> str | None:
        row = self._conn.execute("SELECT value FROM meta WHERE key='current_spec'").fetchone()
        return str(row["value"]) if row else None

    def spec(self, spec_hash: str) -> dict[str, Any]:
        row = self._conn.execute("SELECT spec_json FROM specs WHERE spec_hash=?", (spec_hash,)).fetchone()
        if row is None:
            raise StoreError(f"unknown spec hash {spec_hash}")
        return dict(json.loads(row["spec_json"]))

    def spec_meta(self, spec_hash: str) -> dict[str, Any]:
        row = self._conn.execute(
            "SELECT design, randomized, planner_seed, created_at_us FROM specs WHERE spec_hash=?", (spec_hash,)
        ).fetchone()
        return dict(row) if row else {}

    def record_plan(self, spec_hash: str, spec_json: dict[str, Any], source_text: str | None, plan: Plan) -> None:
        """Record a spec version and its planned trials. Existing trials (same id) are kept as they are."""
        ts = now_us()
        with self._tx() as c:
            c.execute(
                "INSERT OR IGNORE INTO specs(spec_hash, spec_json, source_text, created_at_us, design, randomized,"
                " planner_seed) VALUES (?,?,?,?,?,?,?)",
                (spec_hash, canonical_json(spec_json), source_text, ts, plan.design, int(plan.randomized), plan.seed),
            )
            c.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('current_spec', ?)", (spec_hash,))
            c.execute("INSERT OR IGNORE INTO meta(key, value) VALUES ('experiment', ?)", (plan.experiment,))
            order = 0
            for batch in plan.batches:
                for m in batch.trials:
                    c.execute(
                        "INSERT OR IGNORE INTO trials(trial_id, manifest_json, config_id, load_point, repeat,"
                        " baseline_run, first_spec_hash, created_at_us) VALUES (?,?,?,?,?,?,?,?)",
                        (m.trial_id, canonical_json(m.model_dump(mode="json")), m.config_id, m.load_point.name,
                         m.repeat, m.baseline_run, spec_hash, ts),
                    )
                    c.execute(
                        "INSERT OR IGNORE INTO spec_trials(spec_hash, trial_id, run_order, batch_index)"
                        " VALUES (?,?,?,?)",
                        (spec_hash, m.trial_id, order, batch.index),
                    )
                    order += 1

    def add_trials(self, spec_hash: str, manifests: list[TrialManifest], batch_index: int) -> None:
        """Record trials planned during a sweep (a rate sweep's follow-ups) under ``spec_hash``."""
        ts = now_us()
        with self._tx() as c:
            row = c.execute("SELECT MAX(run_order) AS n FROM spec_trials WHERE spec_hash=?", (spec_hash,)).fetchone()
            order = int(row["n"] if row["n"] is not None else -1) + 1
            for m in manifests:
                c.execute(
                    "INSERT OR IGNORE INTO trials(trial_id, manifest_json, config_id, load_point, repeat,"
                    " baseline_run, first_spec_hash, created_at_us) VALUES (?,?,?,?,?,?,?,?)",
                    (m.trial_id, canonical_json(m.model_dump(mode="json")), m.config_id, m.load_point.name,
                     m.repeat, m.baseline_run, spec_hash, ts),
                )
                cur = c.execute(
                    "INSERT OR IGNORE INTO spec_trials(spec_hash, trial_id, run_order, batch_index) VALUES (?,?,?,?)",
                    (spec_hash, m.trial_id, order, batch_index),
                )
                order += cur.rowcount

    def planned_trial_ids(self, spec_hash: str) -> list[str]:
        rows = self._conn.execute(
            "SELECT trial_id FROM spec_trials WHERE spec_hash=? ORDER BY run_order", (spec_hash,)
        ).fetchall()
        return [r["trial_id"] for r in rows]

    def trials(self) -> list[tuple[str, TrialManifest, str]]:
        """Every trial ever planned: (trial_id, manifest, first spec hash), oldest first."""
        rows = self._conn.execute(
            "SELECT trial_id, manifest_json, first_spec_hash FROM trials ORDER BY created_at_us, rowid"
        ).fetchall()
        return [(r["trial_id"], TrialManifest.model_validate_json(r["manifest_json"]), r["first_spec_hash"]) for r in rows]

    # ------------------------------------------------------------------ attempts

    def attempts(self, trial_id: str) -> list[AttemptRow]:
        rows = self._conn.execute("SELECT * FROM attempts WHERE trial_id=? ORDER BY attempt", (trial_id,)).fetchall()
        return [_attempt(r) for r in rows]

    def all_attempts(self) -> list[AttemptRow]:
        rows = self._conn.execute("SELECT * FROM attempts ORDER BY trial_id, attempt").fetchall()
        return [_attempt(r) for r in rows]

    def latest_finished(self) -> dict[str, AttemptRow]:
        """For each trial, its latest attempt that finished (ok or failed)."""
        out: dict[str, AttemptRow] = {}
        for a in self.all_attempts():
            if a.status in ("ok", "failed"):
                out[a.trial_id] = a
        return out

    def begin_attempt(self, trial_id: str, *, daemon_id: str, batch_id: str, spec_hash: str,
                      attempt: int | None = None, daemon_key_id: str | None = None) -> int:
        """Open a new attempt (``running``) and return its number (1, 2, ...). ``attempt``: the number
        the caller expects (the lease epoch it grants); it must be the next one, else :class:`StoreError`."""
        with self._tx() as c:
            row = c.execute("SELECT MAX(attempt) AS n FROM attempts WHERE trial_id=?", (trial_id,)).fetchone()
            nxt = int(row["n"] or 0) + 1
            if attempt is not None and attempt != nxt:
                raise StoreError(f"trial {trial_id[:12]}: attempt {attempt} requested, but the next attempt is {nxt}")
            attempt = nxt
            c.execute(
                "INSERT INTO attempts(trial_id, attempt, status, daemon_id, batch_id, spec_hash, started_at_us,"
                " daemon_key_id) VALUES (?,?,?,?,?,?,?,?)",
                (trial_id, attempt, "running", daemon_id, batch_id, spec_hash, now_us(), daemon_key_id),
            )
            c.execute(
                "INSERT INTO transitions(trial_id, attempt, batch_id, at_us, phase, detail) VALUES (?,?,?,?,?,?)",
                (trial_id, attempt, batch_id, now_us(), "granted", daemon_id),
            )
        return attempt

    def attempt_status(self, trial_id: str, attempt: int) -> tuple[str, str | None] | None:
        row = self._conn.execute(
            "SELECT status, submission_id FROM attempts WHERE trial_id=? AND attempt=?", (trial_id, attempt)
        ).fetchone()
        return (row["status"], row["submission_id"]) if row else None

    def record_transition(self, trial_id: str | None, attempt: int | None, batch_id: str, phase: str, detail: str = "") -> None:
        self._conn.execute(
            "INSERT INTO transitions(trial_id, attempt, batch_id, at_us, phase, detail) VALUES (?,?,?,?,?,?)",
            (trial_id, attempt, batch_id, now_us(), phase, detail),
        )

    def finish_attempt(
        self,
        trial_id: str,
        attempt: int,
        *,
        status: str,
        failure_kind: str | None,
        error: str | None,
        submission_id: str | None,
        record: dict[str, Any] | None,
        metrics: dict[str, Any] | None,
        hardware_class: str | None,
    ) -> Path | None:
        """Close a running attempt. With ``record``, first write it to its own immutable result file."""
        current = self.attempt_status(trial_id, attempt)
        if current is None:
            raise StoreError(f"trial {trial_id[:12]} has no attempt {attempt}")
        if current[0] != "running":
            raise StoreError(f"attempt {attempt} of trial {trial_id[:12]} already finished as {current[0]}")
        check_attempt(current[0], status)
        path = self._write_result_file(trial_id, attempt, record) if record is not None else None
        with self._tx() as c:
            c.execute(
                "UPDATE attempts SET status=?, failure_kind=?, error=?, submission_id=?, result_path=?, metrics_json=?,"
                " hardware_class=?, finished_at_us=? WHERE trial_id=? AND attempt=? AND status='running'",
                (status, failure_kind, error, submission_id,
                 str(path.relative_to(self.folder)) if path else None,
                 json.dumps(metrics) if metrics is not None else None, hardware_class, now_us(), trial_id, attempt),
            )
            c.execute(
                "INSERT INTO transitions(trial_id, attempt, batch_id, at_us, phase, detail) VALUES (?,?,NULL,?,?,?)",
                (trial_id, attempt, now_us(), status, failure_kind or ""),
            )
        return path

    def _write_result_file(self, trial_id: str, attempt: int, record: dict[str, Any]) -> Path:
        folder = self.folder / "results" / trial_id
        folder.mkdir(parents=True, exist_ok=True)
        final = folder / f"attempt-{attempt}.json"
        fd, tmp = tempfile.mkstemp(prefix=".attempt-", suffix=".json", dir=folder)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(record, fh, indent=1, sort_keys=True)
                fh.flush()
                os.fsync(fh.fileno())
            try:
                os.link(tmp, final)  # fails if the file exists: a result is never overwritten
            except FileExistsError:
                raise StoreError(f"result file {final} already exists; refusing to overwrite a measurement") from None
        finally:
            os.unlink(tmp)
        return final

    def update_metrics(self, trial_id: str, attempt: int, metrics: dict[str, Any]) -> None:
        """Replace the *derived* metrics of a finished attempt (e.g. SLO attainment under new SLOs).
        The attempt's result file, which holds what was measured, is never touched."""
        self._conn.execute(
            "UPDATE attempts SET metrics_json=? WHERE trial_id=? AND attempt=? AND status='ok'",
            (json.dumps(metrics), trial_id, attempt),
        )

    def running_attempts(self) -> list[tuple[str, int, str, str]]:
        """Attempts still ``running`` (left by a coordinator that stopped): (trial, attempt, daemon, batch)."""
        rows = self._conn.execute(
            "SELECT trial_id, attempt, daemon_id, batch_id FROM attempts WHERE status='running' ORDER BY rowid"
        ).fetchall()
        return [(r["trial_id"], int(r["attempt"]), r["daemon_id"] or "", r["batch_id"] or "") for r in rows]

    def running_key_ids(self) -> dict[tuple[str, int], str]:
        """(trial, attempt) -> the daemon key id of each ``running`` attempt that recorded one."""
        rows = self._conn.execute(
            "SELECT trial_id, attempt, daemon_key_id FROM attempts WHERE status='running' AND daemon_key_id IS NOT NULL"
        ).fetchall()
        return {(r["trial_id"], int(r["attempt"])): r["daemon_key_id"] for r in rows}

    def max_attempts(self) -> dict[str, int]:
        """The highest attempt number of every trial that has one."""
        rows = self._conn.execute("SELECT trial_id, MAX(attempt) AS n FROM attempts GROUP BY trial_id").fetchall()
        return {r["trial_id"]: int(r["n"]) for r in rows}

    def accepted_submissions(self) -> dict[tuple[str, int], str]:
        """(trial, attempt) -> submission id of every finished attempt that came from a daemon's result."""
        rows = self._conn.execute(
            "SELECT trial_id, attempt, submission_id FROM attempts WHERE status!='running' AND submission_id IS NOT NULL"
        ).fetchall()
        return {(r["trial_id"], int(r["attempt"])): r["submission_id"] for r in rows}

    def close_attempts(self, pairs: list[tuple[str, int]], reason: str) -> list[tuple[str, int]]:
        """Close these attempts as transport failures where they are still running; returns those closed."""
        closed = []
        for trial_id, attempt in pairs:
            status = self.attempt_status(trial_id, attempt)
            if status is not None and status[0] == "running":
                self.finish_attempt(
                    trial_id, attempt, status="failed", failure_kind="transport", error=reason,
                    submission_id=None, record=None, metrics=None, hardware_class=None,
                )
                closed.append((trial_id, attempt))
        return closed

    def close_abandoned(self, reason: str) -> list[tuple[str, int]]:
        """Close every ``running`` attempt as a transport failure (its coordinator is gone)."""
        rows = self._conn.execute("SELECT trial_id, attempt FROM attempts WHERE status='running'").fetchall()
        closed = []
        for r in rows:
            self.finish_attempt(
                r["trial_id"], r["attempt"], status="failed", failure_kind="transport", error=reason,
                submission_id=None, record=None, metrics=None, hardware_class=None,
            )
            closed.append((r["trial_id"], r["attempt"]))
        return closed

    # ------------------------------------------------------------------ sweeps

    def begin_sweep(self, spec_hash: str, detail: str = "") -> int:
        cur = self._conn.execute(
            "INSERT INTO sweeps(spec_hash, started_at_us, status, detail) VALUES (?,?,?,?)",
            (spec_hash, now_us(), "running", detail),
        )
        return int(cur.lastrowid or 0)

    def end_sweep(self, sweep_id: int, status: str) -> None:
        self._conn.execute("UPDATE sweeps SET status=?, finished_at_us=? WHERE id=?", (status, now_us(), sweep_id))

    def close_stale_sweeps(self) -> int:
        cur = self._conn.execute(
            "UPDATE sweeps SET status='died', finished_at_us=? WHERE status='running'", (now_us(),)
        )
        return cur.rowcount


def _attempt(r: sqlite3.Row) -> AttemptRow:
    return AttemptRow(
        trial_id=r["trial_id"],
        attempt=r["attempt"],
        status=r["status"],
        failure_kind=r["failure_kind"],
        error=r["error"],
        started_at_us=r["started_at_us"],
        finished_at_us=r["finished_at_us"],
        result_path=r["result_path"],
        metrics=json.loads(r["metrics_json"]) if r["metrics_json"] else None,
        hardware_class=r["hardware_class"],
        submission_id=r["submission_id"],
        daemon_key_id=r["daemon_key_id"] if "daemon_key_id" in r.keys() else None,
    )


def _migrate(conn: sqlite3.Connection) -> None:
    """Bring a store written by an older servetune up to this schema (columns added since; a store
    opened read-only is read as it is, missing columns read as None)."""
    have = {r["name"] for r in conn.execute("PRAGMA table_info(attempts)")}
    if "daemon_key_id" not in have:
        conn.execute("ALTER TABLE attempts ADD COLUMN daemon_key_id TEXT")
