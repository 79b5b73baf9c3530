"""The experiment store: SQLite (WAL) metadata plus one immutable JSON file per finished attempt.

Layout of an experiment folder (``<results root>/<name>/``)::

    experiment.sqlite          specs, trials, attempts, state transitions, sweeps, the schedule state
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
- **Durable before acknowledged.** A finished attempt's record is written into SQLite
  (``pending_results``) in the same transaction as the attempt's row; commits are fsynced
  (``synchronous=FULL``), so when :meth:`Store.finish_attempt` returns, or the :meth:`Store.group`
  it ran in has committed, the result survives a crash. The result file is a view of that row:
  written right after the commit (:meth:`Store.write_result_files`, without an fsync of its own),
  then fsynced and its row dropped when the store is closed (:meth:`Store.settle_result_files`). A
  store opened after a crash first rewrites, from SQLite, every result file that a crash left
  missing or incomplete.
- :meth:`Store.group` makes every write inside it one transaction (one fsync for many results);
  the coordinator sends the ACKs of a group's results only after it has committed.
"""

from __future__ import annotations

import ctypes
import itertools
import json
import logging
import os
import sqlite3
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servetune.canonical import canonical_json
from servetune.errors import ServetuneError
from servetune.manifest import Plan, PrunedConfig, TrialManifest
from servetune.schema import DB_FILE
from servetune.states import check_attempt

log = logging.getLogger(__name__)

#: meta key prefix (then the spec hash) of the configs a plan pruned before any trial (JSON list)
_PRUNED_KEY = "pruned_configs:"

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
CREATE TABLE IF NOT EXISTS pending_results (
    trial_id TEXT NOT NULL, attempt INTEGER NOT NULL, result_path TEXT NOT NULL, record_json TEXT NOT NULL,
    PRIMARY KEY (trial_id, attempt)
);
CREATE TABLE IF NOT EXISTS sweeps (
    id INTEGER PRIMARY KEY AUTOINCREMENT, spec_hash TEXT NOT NULL, started_at_us INTEGER NOT NULL,
    finished_at_us INTEGER, status TEXT NOT NULL, detail TEXT
);
CREATE TABLE IF NOT EXISTS schedule (
    key TEXT PRIMARY KEY, value_json TEXT NOT NULL, updated_at_us INTEGER NOT NULL
);
"""


#: Numbers of the temporary result file names of this process (every store in it shares them).
_TMP_SEQ = itertools.count(1)


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

    def __init__(self, folder: Path, conn: sqlite3.Connection, *, readonly: bool = False):
        self.folder = folder
        self._folder_text = str(folder)
        self._conn = conn
        self._readonly = readonly
        self._depth = 0  # nesting of _tx/group: only the outermost begins and commits
        self._unwritten: list[tuple[str, str]] = []  # records (path as text, JSON) whose file is not written yet
        self._unsettled: list[Path] = []  # result files written, not yet fsynced (their rows kept)
        self._folders: set[str] = set()  # result folders known to exist
        #: Trial folders under ``results/`` when the store was opened for writing (None: not read).
        #: A result file for a running attempt can exist only in one of them: this store writes a
        #: trial's files only for attempts it finished, each once (see :meth:`finish_attempt`).
        self._trial_dirs_at_open: set[str] | None = None
        #: True: the result files are left to another process (:meth:`materialize_result_files`,
        #: the coordinator's results.nc writer) and to :meth:`settle_result_files` at close.
        self.defer_result_files = False
        #: trial id -> (manifest JSON, manifest) kept by a caller that reads :meth:`trials` again and
        #: again (the results.nc writer child: parsing every manifest was most of each rewrite).
        self.manifest_cache: dict[str, tuple[str, TrialManifest]] | None = None

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
        conn.execute("PRAGMA synchronous=FULL")  # every commit fsyncs the WAL: results are durable at COMMIT
        conn.executescript(_SCHEMA)
        _migrate(conn)
        store = cls(path, conn)
        try:
            store._trial_dirs_at_open = set(os.listdir(path / "results"))
        except FileNotFoundError:
            store._trial_dirs_at_open = set()
        store.settle_result_files()  # a crash may have left result files unwritten or incomplete
        return store

    @classmethod
    def open_readonly(cls, folder: str | os.PathLike[str]) -> Store:
        db = Path(folder) / DB_FILE
        if not db.exists():
            raise StoreError(f"no experiment store at {db}")
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30.0, isolation_level=None)
        conn.row_factory = sqlite3.Row
        return cls(Path(folder), conn, readonly=True)

    def close(self) -> None:
        """Write and fsync every result file still owed, then close."""
        try:
            if not self._readonly:
                self.settle_result_files()
        finally:
            self._conn.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """A transaction; inside :meth:`group` (or another ``_tx``) a savepoint of the outer one,
        so each store operation stays all or nothing there too."""
        if self._depth:
            name = f"sp{self._depth}"
            self._conn.execute(f"SAVEPOINT {name}")
            self._depth += 1
            mark = len(self._unwritten)
            try:
                yield self._conn
            except BaseException:
                self._conn.execute(f"ROLLBACK TO {name}")
                self._conn.execute(f"RELEASE {name}")
                del self._unwritten[mark:]
                raise
            finally:
                self._depth -= 1
            self._conn.execute(f"RELEASE {name}")
            return
        self._conn.execute("BEGIN IMMEDIATE")
        self._depth = 1
        mark = len(self._unwritten)
        try:
            yield self._conn
        except BaseException:
            self._depth = 0
            self._conn.execute("ROLLBACK")
            del self._unwritten[mark:]  # rolled back: those records were never stored
            raise
        self._depth = 0
        self._conn.execute("COMMIT")

    @contextmanager
    def group(self) -> Iterator[None]:
        """Run many store writes as one transaction: one COMMIT, one fsync. Each operation inside
        is all or nothing by itself (a savepoint); an exception that leaves the group rolls back
        all of them, and nothing of it may be acknowledged.

        The result files of the records finished inside are not written by the group: call
        :meth:`write_result_files` after it (the coordinator sends its ACKs first)."""
        with self._tx():
            yield

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
            if plan.pruned:
                c.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", (
                    f"{_PRUNED_KEY}{spec_hash}", canonical_json([_pruned_entry(p) for p in plan.pruned])))
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

    def add_pruned(self, spec_hash: str, pruned: Sequence[PrunedConfig]) -> None:
        """Add configs an adaptive planner left out during the sweep to those recorded for
        ``spec_hash`` (one entry per config and target, the first reason kept)."""
        with self._tx() as c:
            key = f"{_PRUNED_KEY}{spec_hash}"
            row = c.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
            entries = list(json.loads(row["value"])) if row else []
            seen = {(e["config_id"], e["hardware_target"]) for e in entries}
            for p in pruned:
                if (p.config_id, p.hardware_target) not in seen:
                    seen.add((p.config_id, p.hardware_target))
                    entries.append(_pruned_entry(p))
            c.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", (key, canonical_json(entries)))

    def pruned_configs(self, spec_hash: str) -> list[dict[str, Any]]:
        """The engine configs the plan of ``spec_hash`` left out before any trial (``config_id``,
        ``engine``, ``hardware_target``, ``is_baseline``, ``reason``), as :meth:`record_plan` recorded them."""
        row = self._conn.execute("SELECT value FROM meta WHERE key=?", (f"{_PRUNED_KEY}{spec_hash}",)).fetchone()
        return list(json.loads(row["value"])) if row else []

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

    def planned_trials(self, spec_hash: str, config_id: str | None = None) -> list[tuple[int, TrialManifest]]:
        """The trials planned under ``spec_hash`` (``config_id``: of that engine config only), in run
        order, each with its batch index."""
        sql = ("SELECT s.batch_index, t.manifest_json FROM spec_trials s JOIN trials t ON t.trial_id=s.trial_id"
               " WHERE s.spec_hash=?" + (" AND t.config_id=?" if config_id is not None else "") + " ORDER BY s.run_order")
        args = (spec_hash,) if config_id is None else (spec_hash, config_id)
        rows = self._conn.execute(sql, args).fetchall()
        return [(int(r["batch_index"]), TrialManifest.model_validate_json(r["manifest_json"])) for r in rows]

    def latest_finished_of(self, trial_ids: list[str]) -> dict[str, AttemptRow]:
        """:meth:`latest_finished` for ``trial_ids`` only."""
        out: dict[str, AttemptRow] = {}
        for t in trial_ids:
            for a in self.attempts(t):
                if a.status in ("ok", "failed"):
                    out[t] = a
        return out

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
        cache = self.manifest_cache
        if cache is None:
            return [(r["trial_id"], TrialManifest.model_validate_json(r["manifest_json"]), r["first_spec_hash"])
                    for r in rows]
        out = []
        for r in rows:
            text = r["manifest_json"]
            hit = cache.get(r["trial_id"])
            if hit is None or hit[0] != text:  # a trial's row never changes; the text is compared all the same
                hit = cache[r["trial_id"]] = (text, TrialManifest.model_validate_json(text))
            out.append((r["trial_id"], hit[1], r["first_spec_hash"]))
        return out

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
        with self._tx():
            return self._begin(trial_id, daemon_id, batch_id, spec_hash, attempt, now_us(), daemon_key_id)

    def begin_attempts(self, attempts: dict[str, int], *, daemon_id: str, batch_id: str, spec_hash: str,
                       daemon_key_id: str | None = None) -> None:
        """Open the attempts of one GRANT (trial -> the attempt number it is granted with) in one
        transaction; each number must be its trial's next, else :class:`StoreError` and none is opened."""
        ts = now_us()
        if not attempts:
            return
        with self._tx() as c:  # one SELECT and two executemany for the GRANT's trials (not 3 executes a trial)
            ids = list(attempts)
            latest: dict[str, int] = {}
            for i in range(0, len(ids), 500):  # under SQLite's bound on ? parameters
                part = ids[i:i + 500]
                rows = c.execute("SELECT trial_id, MAX(attempt) AS n FROM attempts WHERE trial_id IN"
                                 f" ({','.join('?' * len(part))}) GROUP BY trial_id", part)
                latest.update((r["trial_id"], int(r["n"] or 0)) for r in rows)
            for trial_id, attempt in attempts.items():
                nxt = latest.get(trial_id, 0) + 1
                if attempt != nxt:
                    raise StoreError(f"trial {trial_id[:12]}: attempt {attempt} requested, but the next attempt is {nxt}")
            c.executemany(
                "INSERT INTO attempts(trial_id, attempt, status, daemon_id, batch_id, spec_hash, started_at_us,"
                " daemon_key_id) VALUES (?,?,?,?,?,?,?,?)",
                [(t, a, "running", daemon_id, batch_id, spec_hash, ts, daemon_key_id) for t, a in attempts.items()],
            )
            c.executemany(
                "INSERT INTO transitions(trial_id, attempt, batch_id, at_us, phase, detail) VALUES (?,?,?,?,?,?)",
                [(t, a, batch_id, ts, "granted", daemon_id) for t, a in attempts.items()],
            )

    def _begin(self, trial_id: str, daemon_id: str, batch_id: str, spec_hash: str, attempt: int | None,
               ts: int, daemon_key_id: str | None = None) -> int:
        c = self._conn
        row = c.execute("SELECT MAX(attempt) AS n FROM attempts WHERE trial_id=?", (trial_id,)).fetchone()
        nxt = int(row["n"] or 0) + 1
        if attempt is not None and attempt != nxt:
            raise StoreError(f"trial {trial_id[:12]}: attempt {attempt} requested, but the next attempt is {nxt}")
        c.execute(
            "INSERT INTO attempts(trial_id, attempt, status, daemon_id, batch_id, spec_hash, started_at_us,"
            " daemon_key_id) VALUES (?,?,?,?,?,?,?,?)",
            (trial_id, nxt, "running", daemon_id, batch_id, spec_hash, ts, daemon_key_id),
        )
        c.execute(
            "INSERT INTO transitions(trial_id, attempt, batch_id, at_us, phase, detail) VALUES (?,?,?,?,?,?)",
            (trial_id, nxt, batch_id, ts, "granted", daemon_id),
        )
        return nxt

    def attempt_status(self, trial_id: str, attempt: int) -> tuple[str, str | None] | None:
        row = self._conn.execute(
            "SELECT status, submission_id FROM attempts WHERE trial_id=? AND attempt=?", (trial_id, attempt)
        ).fetchone()
        return (row["status"], row["submission_id"]) if row else None

    def attempt_key_id(self, trial_id: str, attempt: int) -> str | None:
        """The key id of the daemon the attempt was granted to (running or finished); None: no such
        attempt, or none recorded."""
        row = self._conn.execute("SELECT daemon_key_id FROM attempts WHERE trial_id=? AND attempt=?",
                                 (trial_id, attempt)).fetchone()
        return row["daemon_key_id"] if row else None

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
        record: dict[str, Any] | str | None,
        metrics: dict[str, Any] | str | None,
        hardware_class: str | None,
    ) -> str | None:
        """Close a running attempt. With ``record``, store it (in the same transaction) for its own
        immutable result file, which is written once the transaction has committed: at once, or
        inside :meth:`group` by :meth:`write_result_files`. ``record``: a dict, or its JSON text
        (a JSON object) when the caller serialized it already; ``metrics`` likewise. Returns that
        file's path, as text (a ``Path`` costs about 13 us, on the coordinator's hot path)."""
        check_attempt("running", status)
        path: str | None = None
        rel: str | None = None
        text: str | None = None
        if record is not None:
            rel = f"results/{trial_id}/attempt-{attempt}.json"
            path = os.path.join(self._folder_text, rel)
            text = record if isinstance(record, str) else json.dumps(record)  # once, no indent or sort
        metrics_json = metrics if isinstance(metrics, str) or metrics is None else json.dumps(metrics)
        ts = now_us()
        with self._tx() as c:
            cur = c.execute(
                "UPDATE attempts SET status=?, failure_kind=?, error=?, submission_id=?, result_path=?, metrics_json=?,"
                " hardware_class=?, finished_at_us=? WHERE trial_id=? AND attempt=? AND status='running'",
                (status, failure_kind, error, submission_id, rel, metrics_json, hardware_class, ts, trial_id, attempt),
            )
            if cur.rowcount != 1:  # the caller believed it running: say why not
                current = self.attempt_status(trial_id, attempt)
                if current is None:
                    raise StoreError(f"trial {trial_id[:12]} has no attempt {attempt}")
                raise StoreError(f"attempt {attempt} of trial {trial_id[:12]} already finished as {current[0]}")
            c.execute(
                "INSERT INTO transitions(trial_id, attempt, batch_id, at_us, phase, detail) VALUES (?,?,NULL,?,?,?)",
                (trial_id, attempt, ts, status, failure_kind or ""),
            )
            if path is not None and rel is not None and text is not None:
                # a file there already (a store rebuilt beside old results): refuse; the savepoint
                # undoes the UPDATE. Only trial folders that existed at open can hold one.
                dirs = self._trial_dirs_at_open
                if (dirs is None or trial_id in dirs) and os.path.exists(path):
                    raise StoreError(f"result file {path} already exists; refusing to overwrite a measurement")
                c.execute("INSERT INTO pending_results(trial_id, attempt, result_path, record_json) VALUES (?,?,?,?)",
                          (trial_id, attempt, rel, text))
                self._unwritten.append((path, text))
        if not self._depth:
            self.write_result_files()
        return path

    def write_result_files(self) -> int:
        """Write the result files of committed records (no fsync: their rows stay until
        :meth:`settle_result_files`). Returns how many were written."""
        if self._depth:
            raise StoreError("write_result_files inside a transaction: its records are not committed yet")
        todo, self._unwritten = self._unwritten, []
        if self.defer_result_files:
            return 0  # durable in pending_results; another process writes the files
        for path_text, text in todo:
            path = Path(path_text)
            self._link_result_file(path, text, fsync=False)
            self._unsettled.append(path)
        return len(todo)

    def materialize_result_files(self, after_rowid: int = 0) -> int:
        """Write the result files of committed records not yet written (``pending_results`` rows
        after ``after_rowid``), from any process, the store opened read-only included; never over
        a different file. Flushed to disk before it returns. Returns the last row id seen."""
        rows = self._conn.execute(  # iterated, not fetched whole: the writer child's memory stays small
            "SELECT rowid, result_path, record_json FROM pending_results WHERE rowid > ? ORDER BY rowid",
            (after_rowid,),
        )
        last = after_rowid
        written = []
        for r in rows:
            path = self.folder / r["result_path"]
            last = max(last, int(r["rowid"]))
            if not path.exists():
                self._link_result_file(path, r["record_json"], fsync=False)
                written.append(path)
        if written and not _syncfs(self.folder):
            for path in written:
                with open(path, "rb") as fh:
                    os.fsync(fh.fileno())
        return last

    def settle_result_files(self) -> int:
        """Make every result file durable and drop the SQLite copies of their records: rewrite
        (from SQLite) any file missing or not holding its record (left by a crash), flush the rest
        to disk, then delete their ``pending_results`` rows. Returns how many rows were settled."""
        self.write_result_files()
        rows = self._conn.execute(  # iterated, not fetched whole: every record's text at once is tens of MB
            "SELECT trial_id, attempt, result_path, record_json FROM pending_results")
        written = {str(p) for p in self._unsettled}
        to_sync: list[Path] = []
        settled: list[tuple[str, int]] = []
        for r in rows:
            settled.append((r["trial_id"], r["attempt"]))
            path = self.folder / r["result_path"]
            to_sync.append(path)
            if str(path) in written:
                continue  # written by this process from this very text
            if not path.exists():  # left to another process that did not get to it, or a crash
                self._link_result_file(path, r["record_json"], fsync=False)
            elif not _holds(path, r["record_json"]):
                log.warning("result file %s was left incomplete by a crash; rewritten from the store", path)
                self._replace_result_file(path, r["record_json"])
        if to_sync and not _syncfs(self.folder):  # one call, else file by file and their folders
            for path in to_sync:
                with open(path, "rb") as fh:
                    os.fsync(fh.fileno())
            for folder in {p.parent for p in to_sync} | {self.folder / "results"}:
                _fsync_dir(folder)
        if settled:
            with self._tx() as c:
                c.executemany("DELETE FROM pending_results WHERE trial_id=? AND attempt=?", settled)
        self._unsettled.clear()
        return len(settled)

    def _link_result_file(self, final: Path, text: str, *, fsync: bool) -> None:
        """Create ``final`` holding ``text`` with an exclusive link: never over an existing file."""
        folder = final.parent
        key = str(folder)
        if key not in self._folders:
            folder.mkdir(parents=True, exist_ok=True)
            self._folders.add(key)
        # a temporary name of this process's own (created exclusively, mode 0600 as mkstemp's),
        # linked under the final name only once complete: a reader never sees half a record
        tmp = os.path.join(key, f".attempt-{os.getpid()}-{next(_TMP_SEQ)}.json")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # left by a dead process that had this pid: a random name instead
            fd, tmp = tempfile.mkstemp(prefix=".attempt-", suffix=".json", dir=key)
        try:
            try:
                data = text.encode("utf-8")
                while data:
                    data = data[os.write(fd, data):]
                if fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            try:
                os.link(tmp, final)  # fails if the file exists: a result is never overwritten
            except FileExistsError:
                if _holds(final, text):
                    return  # this very record, already written (repaired from SQLite by a reopen)
                raise StoreError(f"result file {final} already exists; refusing to overwrite a measurement") from None
        finally:
            os.unlink(tmp)

    def _replace_result_file(self, final: Path, text: str) -> None:
        """Repair a result file from its record in SQLite (the durable copy), fsynced."""
        final.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".attempt-", suffix=".json", dir=final.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, final)
        except BaseException:
            os.unlink(tmp)
            raise

    def _write_result_file(self, trial_id: str, attempt: int, record: dict[str, Any]) -> Path:
        """Write one result file at once, fsynced (outside the SQLite path; kept for tools and tests)."""
        final = self.folder / "results" / trial_id / f"attempt-{attempt}.json"
        self._link_result_file(final, json.dumps(record), fsync=True)
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

    # ------------------------------------------------------------------ schedule state

    def put_schedule(self, key: str, value: Any) -> None:
        """Set one entry of the latest sweep's schedule state (``coordinator.schedule``: policy,
        ``daemon:<id>``, ``drained:<class>``, retries, clock offsets) to the JSON-able ``value``."""
        with self._tx() as conn:
            conn.execute("INSERT INTO schedule(key, value_json, updated_at_us) VALUES (?,?,?) ON CONFLICT(key) "
                         "DO UPDATE SET value_json=excluded.value_json, updated_at_us=excluded.updated_at_us",
                         (key, json.dumps(value, sort_keys=True), now_us()))

    def schedule(self) -> dict[str, Any]:
        """The schedule state, key -> value."""
        return {r["key"]: json.loads(r["value_json"]) for r in self._conn.execute("SELECT key, value_json FROM schedule")}

    def clear_schedule(self) -> None:
        """A new sweep starts with an empty schedule state."""
        with self._tx() as conn:
            conn.execute("DELETE FROM schedule")

    def close_stale_sweeps(self) -> int:
        cur = self._conn.execute(
            "UPDATE sweeps SET status='died', finished_at_us=? WHERE status='running'", (now_us(),)
        )
        return cur.rowcount


def _pruned_entry(p: PrunedConfig) -> dict[str, Any]:
    """How a pruned config is recorded (:meth:`Store.pruned_configs` reads it back)."""
    return {"config_id": p.config_id, "engine": p.config.model_dump(mode="json"),
            "hardware_target": p.hardware_target, "is_baseline": p.is_baseline, "reason": p.reason}


def _holds(path: Path, text: str) -> bool:
    """Whether the file at ``path`` holds exactly ``text``."""
    try:
        return path.read_text(encoding="utf-8") == text
    except (OSError, UnicodeDecodeError):
        return False


def _syncfs(folder: Path) -> bool:
    """Flush the file system that holds ``folder`` in one call (Linux ``syncfs``); False where it
    is not available, and the caller fsyncs file by file."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        syncfs = libc.syncfs
    except (OSError, AttributeError):
        return False
    fd = os.open(folder, os.O_RDONLY)
    try:
        return bool(syncfs(fd) == 0)
    finally:
        os.close(fd)


def _fsync_dir(folder: Path) -> None:
    """fsync a directory, so the names of files created in it survive a crash."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
