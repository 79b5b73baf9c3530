"""Which daemons may measure an experiment, and where a trial may fail over. Pure: no sockets, no store, no clock.

The spec's ``hardware`` section (:mod:`servetune.hardware`) names targets; each batch is planned
once per target and pinned to it (:class:`coordinator.leases.BatchWork`). The rules:

- **Admission.** A daemon is given work when its hardware class (``daemon/fingerprint.py``) is a
  class target, matches a filter target (below), or is a class some target declares it may fail
  over to (``failover_to``). Any other daemon is refused work, with the reason, when it says HELLO
  (:meth:`TargetBook.admit`). With no ``hardware`` section, or one that names no targets, every
  daemon is admitted, as before.
- **Filters bind to one class.** A filter target is measured on exactly one hardware class per
  sweep: the class of the first daemon to join that matches it. Its batches wait, pinned to
  ``filter:<name>`` (no class can equal it), until then, and are pinned to that class from then on
  (queued work, live leases, and work added later through :meth:`TargetBook.pin`). A later daemon
  of another class that also matches the filter is refused work for it, saying which class the
  filter is bound to. One daemon may bind several filters. Every attempt records the class it ran
  on (``hardware_class``).
- **A resumed sweep prefers last time's class.** :func:`prior_bindings` reads, from the stored
  attempts, the class each filter's trials last ran on; the :class:`TargetBook` of the resumed
  sweep is given it (``preferred``) and a deadline (``prefer_until``, on the control core's
  clock). A daemon of that class that matches binds the filter to it again ("as in the previous
  sweep"). A daemon of another matching class that joins before the deadline is admitted but does
  not bind the filter: the filter waits for its previous class, and says so. At the deadline
  (:meth:`TargetBook.settle`, every tick) a filter still unbound binds to the first other
  matching class that joined and is still present, saying that its trials now span two classes
  (the analysis keeps classes apart); one that joins after the deadline binds it as usual.
- **Matching a filter.** The node has at least one GPU; ``gpu_count``: exactly that many; every
  GPU's model name matches ``gpu_model`` (a case-insensitive glob) or ``gpu_model_regex`` (the
  whole name, case-insensitive); ``min_gpu_memory_gib``: every GPU reports at least that much
  (a GPU whose memory is unknown does not match).
- **Failover** (:func:`failover_work`) only where the spec declares it: the trials of a target that
  has no daemon in service become new trials (their own trial ids, tagged
  ``failover-from:<class or daemon>``) pinned to the first declared class that has one, and each
  original stays a hole whose reason names the trial that stands in for it. Who decides that a
  class is drained (the circuit breaker) calls it; a failover trial never fails over again.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Collection, Iterable, Mapping, MutableSequence
from dataclasses import dataclass, field

from coordinator.leases import BatchWork, LeaseTable
from coordinator.policy import ClassQueues
from servetune.hardware import FILTER_PREFIX, HardwareSpec, HardwareTarget
from servetune.manifest import FAILOVER_TAG_PREFIX, PlannedBatch
from servetune.result import Fingerprint

#: Batch indices of failover batches: the original's index plus this (rate-sweep follow-ups use 10,000).
FAILOVER_BATCH_OFFSET = 20_000


def filter_mismatch(target: HardwareTarget, fp: Fingerprint) -> str | None:
    """Why the node of ``fp`` does not match filter ``target`` (None: it matches)."""
    gpus = fp.gpus
    if not gpus:
        return "the node has no GPU"
    if target.gpu_count is not None and len(gpus) != target.gpu_count:
        return f"the node has {len(gpus)} GPU(s), not {target.gpu_count}"
    for gpu in gpus:
        if target.gpu_model is not None and not fnmatch.fnmatchcase(gpu.name.lower(), target.gpu_model.lower()):
            return f"GPU {gpu.index} {gpu.name!r} does not match gpu_model {target.gpu_model!r}"
        if target.gpu_model_regex is not None and not re.fullmatch(target.gpu_model_regex, gpu.name, re.IGNORECASE):
            return f"GPU {gpu.index} {gpu.name!r} does not match gpu_model_regex {target.gpu_model_regex!r}"
        if target.min_gpu_memory_gib is not None:
            if gpu.memory_mib is None:
                return f"GPU {gpu.index} does not report its memory (min_gpu_memory_gib {target.min_gpu_memory_gib:g})"
            if gpu.memory_mib / 1024 < target.min_gpu_memory_gib:
                return (f"GPU {gpu.index} has {gpu.memory_mib / 1024:.1f} GiB, below min_gpu_memory_gib "
                        f"{target.min_gpu_memory_gib:g}")
    return None


@dataclass(frozen=True)
class Admission:
    """What :meth:`TargetBook.admit` decided: ``refusal`` (None: admitted) and what a person
    should read (a filter bound to a class)."""

    refusal: str | None = None
    notes: tuple[str, ...] = ()
    #: This session (``who``) was refused before (a re-sent HELLO): say it once.
    repeated: bool = False


@dataclass
class TargetBook:
    """One sweep's targets and the classes its filter targets are bound to (label -> class)."""

    hardware: HardwareSpec | None
    bound: dict[str, str] = field(default_factory=dict)
    refused: set[str] = field(default_factory=set)  # the ``who`` of each session refused
    #: A resumed sweep: filter label -> the class it was bound to last time (:func:`prior_bindings`).
    preferred: dict[str, str] = field(default_factory=dict)
    #: Until when (control-core clock) an unbound filter waits for its preferred class; None: no wait.
    prefer_until: float | None = None
    #: Filter label -> other matching classes that joined while it waited, in order.
    candidates: dict[str, list[str]] = field(default_factory=dict)

    def _waits(self, label: str, cls: str, now: float | None) -> bool:
        """Whether filter ``label`` (unbound) should not bind to ``cls`` now: it prefers another class
        and its wait is not over."""
        want = self.preferred.get(label)
        if want is None or want == cls or self.prefer_until is None:
            return False
        return now is None or now < self.prefer_until

    def admit(self, fp: Fingerprint, queue: MutableSequence[BatchWork] | ClassQueues | None = None,
              leases: LeaseTable | None = None, who: str = "", now: float | None = None) -> Admission:
        """Whether the daemon of ``fp`` may be given work; binds every unbound filter it matches to
        its class and re-pins that filter's ``queue`` and ``leases`` (see the module docstring).
        ``who`` names the session (daemon and nonce): its refusal is marked ``repeated`` after the first.
        ``now``: the control core's clock, for a resumed sweep's wait for a filter's previous class."""
        if self.hardware is None or not self.hardware.targets:
            return Admission()
        cls = fp.hardware_class
        matched = False
        why: list[str] = []
        notes: list[str] = []
        for target in self.hardware.targets:
            if not target.is_filter:
                matched |= target.hardware_class == cls
                continue
            bound = self.bound.get(target.label)
            mismatch = filter_mismatch(target, fp)
            if bound is not None:
                matched |= bound == cls
                if bound != cls:
                    why.append(f"filter {target.name!r}: {mismatch}" if mismatch is not None else
                               f"filter {target.name!r} is bound to {bound} (the first matching class to join; a "
                               "filter target is measured on one class)")
            elif mismatch is None and self._waits(target.label, cls, now):
                matched = True
                waiting = self.candidates.setdefault(target.label, [])
                if cls not in waiting:
                    waiting.append(cls)
                    left = f" for up to {self.prefer_until - now:.0f} s" if self.prefer_until is not None and now is not None else ""
                    notes.append(f"hardware target filter {target.name!r}: {cls} matches, but the filter waits{left} "
                                 f"for {self.preferred[target.label]}, the class it was bound to in the previous sweep")
            elif mismatch is None:
                self.bound[target.label] = cls
                matched = True
                before = self.preferred.get(target.label)
                if before == cls:
                    notes.append(f"hardware target filter {target.name!r} bound to {cls} again, as in the previous "
                                 "sweep of this experiment")
                elif before is not None:
                    notes.append(_rebound_note(target.name, cls, before))
                else:
                    notes.append(f"hardware target filter {target.name!r} bound to {cls} (the first matching class "
                                 "to join)")
            else:
                why.append(f"filter {target.name!r}: {mismatch}")
        matched |= cls in self.failover_classes()
        if notes:
            self.rebind(queue if queue is not None else [], leases)
        if matched:
            return Admission(notes=tuple(notes))
        wanted = ", ".join(t.hardware_class or f"filter {t.name!r}" for t in self.hardware.targets)
        detail = f" ({'; '.join(why)})" if why else ""
        repeated = who in self.refused
        self.refused.add(who)
        return Admission(refusal=f"hardware class {cls} is not a target of this experiment (targets: {wanted}){detail}",
                         notes=tuple(notes), repeated=repeated)

    def settle(self, now: float, present: Collection[str], queue: MutableSequence[BatchWork] | ClassQueues,
               leases: LeaseTable | None = None) -> list[str]:
        """Past ``prefer_until``: bind each filter still waiting for its previous class to the first
        other matching class that joined meanwhile and is still ``present`` (classes of connected
        daemons); returns what a person should read."""
        if self.prefer_until is None or now < self.prefer_until or not self.candidates:
            return []
        notes = []
        for label, classes in list(self.candidates.items()):
            cls = next((c for c in classes if c in present), None)
            if label in self.bound or cls is None:
                if label in self.bound:
                    del self.candidates[label]
                continue
            del self.candidates[label]
            self.bound[label] = cls
            notes.append(_rebound_note(label[len(FILTER_PREFIX):], cls, self.preferred[label]))
        if notes:
            self.rebind(queue, leases)
        return notes

    def failover_classes(self) -> set[str]:
        """Every class some target may fail over to (admitted, given only work pinned to it)."""
        return {c for classes in (self.hardware.failover_to.values() if self.hardware else ()) for c in classes}

    def pin(self, work: BatchWork) -> BatchWork:
        """``work`` pinned to the class its filter target is bound to (as it is otherwise)."""
        cls = self.bound.get(work.hardware_class or "")
        return BatchWork(work.batch, work.trials, cls) if cls is not None else work

    def rebind(self, queue: MutableSequence[BatchWork] | ClassQueues, leases: LeaseTable | None = None) -> None:
        """Re-pin queued work (in place) and live leases of filters bound since they were pinned."""
        if isinstance(queue, ClassQueues):
            queue.repin(self.pin)  # re-pinned work moves to its class's queue
        else:
            for i, work in enumerate(queue):
                queue[i] = self.pin(work)
        for lease in leases or ():
            lease.work = self.pin(lease.work)


def _rebound_note(name: str | None, cls: str, before: str) -> str:
    return (f"hardware target filter {name!r} bound to {cls}; in the previous sweep it was bound to {before}, of "
            f"which no daemon joined in time: its trials now span two hardware classes (analysed apart)")


def prior_bindings(targets_of: Mapping[str, str | None],
                   attempts: Iterable[tuple[str, str | None, int]]) -> dict[str, str]:
    """The class each filter target was bound to in earlier sweeps of an experiment: for each filter
    label (``filter:<name>``), the class of the latest attempt (by start time) of a trial planned for
    it that ran somewhere. ``targets_of``: trial id -> its manifest's ``hardware_target``;
    ``attempts``: (trial id, hardware class or None, started at) as the store records them."""
    latest: dict[str, tuple[int, str]] = {}
    for trial_id, cls, started in attempts:
        label = targets_of.get(trial_id)
        if cls and is_filter_pin(label):
            assert label is not None
            if label not in latest or started >= latest[label][0]:
                latest[label] = (started, cls)
    return {label: cls for label, (_, cls) in latest.items()}


def is_filter_pin(pin: str | None) -> bool:
    """Whether ``pin`` names a filter target not yet bound to a class."""
    return pin is not None and pin.startswith(FILTER_PREFIX)


@dataclass(frozen=True)
class Failover:
    """Work moved off a drained class: ``moved`` (new trials, pinned to ``to_class``) and the hole
    reason of each original trial (trial id -> reason naming the trial that stands in for it)."""

    moved: BatchWork
    holes: dict[str, str]
    to_class: str
    source: str


def failover_work(hardware: HardwareSpec | None, work: BatchWork, in_service: Collection[str], *,
                  source: str | None = None, since: str | None = None) -> Failover | None:
    """Move ``work`` (a batch's trials still to run, of a target with no daemon in service) to the
    first class its target declares interchangeable (``hardware.failover_to``) that is in
    ``in_service`` (classes with a daemon in service). None when the spec declares no failover for
    it, none of those classes is in service, or the trials are failovers already (they stay holes).

    ``source``: what the trials move away from, for the ``failover-from:`` tag and the hole reason
    (default: the class the work is pinned to, or its target's label while a filter is unbound);
    ``since``: when that class was last in service, for the hole reason. The moved trials' manifests
    must be recorded in the store (their own trial ids) before they are granted."""
    if hardware is None or not work.trials or any(m.failover_from is not None for m in work.trials):
        return None
    target = hardware.target(work.batch.hardware_target or "")
    if target is None:
        return None
    to_class = next((c for c in hardware.failover_to.get(target.key, []) if c in in_service), None)
    if to_class is None:
        return None
    source = source or work.hardware_class or target.label
    tag = f"{FAILOVER_TAG_PREFIX}{source}"
    moved = tuple(m.model_copy(update={"hardware_target": to_class, "tags": (*m.tags, tag)}) for m in work.trials)
    batch = PlannedBatch(index=FAILOVER_BATCH_OFFSET + work.batch.index, config=work.batch.config, trials=moved,
                         is_baseline=work.batch.is_baseline)
    when = f" since {since}" if since else ""
    holes = {
        old.trial_id: (f"not attempted: no daemon of {source} in service{when}; failed over to class {to_class} as "
                       f"trial {new.trial_id[:12]} (tagged {tag}); re-run to retry on {source}")
        for old, new in zip(work.trials, moved)
    }
    return Failover(moved=BatchWork(batch, moved, to_class), holes=holes, to_class=to_class, source=source)
