"""The daemon's uploads of its spool, beside the session: what the agent calls each loop (no sockets).

:class:`SpoolSender` joins the spool (:mod:`daemon.artifact_spool`) and the uploads
(:mod:`daemon.artifact_upload`). The agent calls :meth:`SpoolSender.step` every loop iteration
with the session's state and sends what it returns; it hands it the coordinator's ARTIFACT_MISSING,
ARTIFACT_STORED and ARTIFACT_REFUSED (:meth:`SpoolSender.on_message`), never to the session.

- Nothing is offered before the session is welcomed. A new welcomed session (start, reconnect,
  REJOIN, a restarted coordinator) restarts every upload under its nonce, so each offers again and
  only the chunks the coordinator still lacks cross; the pacing interval becomes the session's
  heartbeat interval (from WELCOME).
- New artifacts are noticed by :attr:`~daemon.artifact_spool.ArtifactSpool.changes` and read from
  :meth:`~daemon.artifact_spool.ArtifactSpool.pending`; so is everything still pending when the
  daemon process starts (a daemon restarted with the same workdir resumes its uploads).
- ARTIFACT_STORED marks the artifact stored in the spool. One refused for good (or unreadable) is
  logged and not offered again by this process; it stays pending in the spool (a later process
  offers it again: to another coordinator, or after the coordinator's bound was raised).
"""

from __future__ import annotations

import logging
from dataclasses import replace

from daemon.artifact_spool import ArtifactSpool
from daemon.artifact_upload import Pacer, PacingPolicy, Uploads
from servetune.artifact_messages import ArtifactChunk, ToCoordinator, ToDaemon

log = logging.getLogger(__name__)


class SpoolSender:
    """See the module docstring. Used by the agent's loop thread only."""

    def __init__(self, spool: ArtifactSpool, policy: PacingPolicy | None = None):
        self.spool = spool
        self.uploads = Uploads(Pacer(policy))
        self._session = ""
        self._seen_changes = -1  # read the spool's pending list at the first welcomed step
        self._given_up: set[tuple[str, int, str]] = set()
        self.stored = 0
        #: When the coordinator last answered an upload, or a chunk last went out (the agent's SHUTDOWN
        #: hold ends when uploads go quiet).
        self.last_progress = float("-inf")

    def step(self, session_nonce: str, welcomed: bool, heartbeat_interval_s: float, now: float) -> list[ToCoordinator]:
        """What to send now: offers for a new session or new artifacts, chunks the pacer allows."""
        if not welcomed or not session_nonce:
            return []
        out: list[ToCoordinator] = []
        if session_nonce != self._session:
            self._session = session_nonce
            pacer = self.uploads.pacer
            pacer.policy = replace(pacer.policy, interval_s=heartbeat_interval_s)
            out += self.uploads.restart(session_nonce, now)
        if self.spool.changes != self._seen_changes:
            self._seen_changes = self.spool.changes
            for art in self.spool.pending():
                key = (art.trial_id, art.attempt, art.manifest.digest())
                if key in self.uploads or key in self._given_up:
                    continue
                out += self.uploads.add(art.trial_id, art.attempt, art.manifest, self.spool.source(art.manifest),
                                        session_nonce, now)
        wake = self.uploads.next_wakeup(now)
        if wake is not None and now >= wake:
            out += self.uploads.tick(now)
        if any(isinstance(m, ArtifactChunk) for m in out):
            self.last_progress = now
        self._settle()
        return out

    @property
    def busy(self) -> bool:
        """Uploads in flight, or artifacts spooled that no step has seen yet."""
        return len(self.uploads) > 0 or self.spool.changes != self._seen_changes

    def reoffer(self, now: float) -> list[ToCoordinator]:
        """Every upload offers again at once (the agent, on a SHUTDOWN that finds uploads in flight:
        an offer lost on the way would otherwise wait ``answer_timeout_s``)."""
        return self.uploads.restart(self._session, now) if self._session else []

    def on_message(self, msg: ToDaemon, now: float) -> list[ToCoordinator]:
        self.last_progress = now
        out = self.uploads.on_message(msg, now)
        self._settle()
        return out

    def _settle(self) -> None:
        for up in self.uploads.finished:
            if up.phase == "stored":
                self.spool.mark_stored(up.trial_id, up.epoch, up.digest)
                self.stored += 1
                log.info("artifact %s (%s) of trial %s attempt %d stored by the coordinator (%d chunk(s) sent)",
                         up.manifest.name, up.digest[:12], up.trial_id[:12], up.epoch, up.chunks_sent)
            else:
                self._given_up.add(up.key)
        self.uploads.finished.clear()
