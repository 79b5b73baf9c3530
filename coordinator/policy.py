"""The fleet policy: where queued work may go, and when a daemon may be handed a batch.

Pure, in the style of :mod:`coordinator.control` (which asks it before every GRANT): no sockets,
no store, and the clock is injected. A benchmark fleet is not a compute cluster: the hardware is
what is measured, so work is not fungible across it, and two trials that share hardware (or one
endpoint) measure each other's load. Contract:

- **Queues** (:class:`ClassQueues`): work waits in one FIFO per hardware class. A batch not yet
  granted (class ``None``) may go to a daemon of any class; once granted it is pinned to that
  daemon's class, and a re-grant after a lost attempt goes first in line of that class's queue.
  No batch ever moves to another class: :meth:`ClassQueues.take` serves a class its own queue,
  then the unpinned one, nothing else.
- **Slots**: a daemon holds at most ``max_concurrency`` batches at once (advertised in its HELLO,
  default 1). Unless the spec declares co-tenancy (``hardware.co_tenancy``), that is capped at one
  batch per device (its GPUs; one on a CPU-only node): a daemon whose owner allows sharing a
  device (``daemon start --co-tenancy``) is given no more than it can run without sharing. A batch counts against it from its GRANT until its lease ends *and* the daemon has
  said READY since (its server stopped, it is idle), or the daemon leaves.
- **Resource groups**: daemons that share hardware or one endpoint form a group (declared in the
  fleet file's ``groups``, or by the daemon's own ``group``); between them they hold at most
  ``group_max_concurrency`` batches at once: the tightest limit any declaration (the fleet file's
  group, the spec's ``hardware.groups`` (merged with the fleet file's: :func:`coordinator.fleet.merge_groups`),
  any member's HELLO) gives wins, 1 when none gives one. An ``openai`` backend whose
  ``base_url`` is not loopback is one shared endpoint: every daemon measuring it is in the implicit
  group ``endpoint:<scheme>://<host>:<port>`` unless it is declared into another group (a loopback
  ``base_url`` is each node's own server: no group). A daemon is in at most one group: the first
  fleet-file group that names it (by id or ``fnmatch`` pattern), else its own, else the endpoint's.
- **Turns**: a group is handed out round-robin over its members in the order they joined, not first
  come first served: a free place goes to the first member after the one granted last that is
  asking for work (a READY within ``turn_wait_s``), has a slot free and has work of its class
  queued. So the daemon that just finished does not win the lock again while another member waits,
  and a member that stopped asking (gone, or busy) never blocks the others for longer than
  ``turn_wait_s``.
"""

from __future__ import annotations

import ipaddress
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from urllib.parse import urlsplit

from coordinator.fleet import GroupSettings
from coordinator.leases import BatchWork
from servetune.spec import BackendSpec

DEFAULT_GROUP_MAX_CONCURRENCY = 1
ENDPOINT_GROUP_PREFIX = "endpoint:"


# ---------------------------------------------------------------------- queues


class ClassQueues:
    """Queued batches, one FIFO per hardware class (``None``: not yet granted, any class may take
    it). Iterating yields the pinned queues first (class by class), then the unpinned one."""

    def __init__(self, work: Iterable[BatchWork] = ()) -> None:
        self._queues: dict[str | None, deque[BatchWork]] = {}
        for w in work:
            self.append(w)

    def append(self, work: BatchWork) -> None:
        self._queues.setdefault(work.hardware_class, deque()).append(work)

    def appendleft(self, work: BatchWork) -> None:
        """First in line of its class (a re-grant after a lost attempt)."""
        self._queues.setdefault(work.hardware_class, deque()).appendleft(work)

    def take(self, hardware_class: str) -> BatchWork | None:
        """The next batch a daemon of ``hardware_class`` may run: its class's queue, then unpinned work."""
        for key in (hardware_class, None):
            q = self._queues.get(key)
            if q:
                return q.popleft()
        return None

    def candidates(self, hardware_class: str) -> Iterator[BatchWork]:
        """What :meth:`take` would hand a daemon of ``hardware_class``, in that order (its class's
        queue, then unpinned work), lazily; nothing is removed (do not change the queues while
        iterating)."""
        for key in (hardware_class, None):
            yield from self._queues.get(key, ())

    def remove(self, work: BatchWork) -> bool:
        """Take ``work`` (this very batch) out of its queue; False when it is not queued."""
        q = self._queues.get(work.hardware_class)
        if q is None:
            return False
        for i, w in enumerate(q):
            if w is work:
                del q[i]
                return True
        return False

    def has_work(self, hardware_class: str) -> bool:
        return bool(self._queues.get(hardware_class)) or bool(self._queues.get(None))

    def drain(self, hardware_class: str | None) -> list[BatchWork]:
        """Remove and return every batch pinned to ``hardware_class`` (unpinned work stays), or,
        with None, every batch no class has taken yet."""
        return list(self._queues.pop(hardware_class, ()))

    def clear(self) -> None:
        self._queues.clear()

    def repin(self, pin: Callable[[BatchWork], BatchWork]) -> None:
        """Every batch replaced by ``pin(batch)``, each in its (possibly new) class's queue, in order."""
        work = list(self)
        self._queues.clear()
        for w in work:
            self.append(pin(w))

    def __iter__(self) -> Iterator[BatchWork]:
        for key, q in list(self._queues.items()):
            if key is not None:
                yield from q
        yield from self._queues.get(None, ())

    def __getitem__(self, index: int) -> BatchWork:
        return list(self)[index]

    def __len__(self) -> int:
        return sum(len(q) for q in self._queues.values())

    def __bool__(self) -> bool:
        return any(self._queues.values())


# ---------------------------------------------------------------------- endpoints


def is_loopback_host(host: str) -> bool:
    if host.lower() in ("localhost", "localhost.localdomain") or host.lower().endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def shared_endpoint(backend: BackendSpec) -> str | None:
    """The implicit group of an ``openai`` backend on a shared (not loopback) endpoint, else None."""
    if backend.kind != "openai" or not backend.base_url:
        return None
    parts = urlsplit(backend.base_url)
    host = parts.hostname or ""
    if not host or is_loopback_host(host):
        return None
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{ENDPOINT_GROUP_PREFIX}{parts.scheme}://{host}:{port}"


# ---------------------------------------------------------------------- members and groups


@dataclass
class Member:
    """A daemon as the policy sees it. ``asked_at``: its latest READY not yet answered with work."""

    daemon_id: str
    hardware_class: str
    max_concurrency: int = 1
    group: str | None = None
    #: The group limit this member declared itself (its HELLO), None: none.
    declared_limit: int | None = None
    asked_at: float | None = None
    #: Granted since its last READY: it still counts as busy after its lease ends, until it says READY.
    settling: bool = False


@dataclass
class Group:
    name: str
    #: The fleet file's limit for it (None: not declared there).
    fleet_limit: int | None = None
    members: list[str] = field(default_factory=list)  # rotation order: the order they joined
    last_turn: str | None = None


@dataclass(frozen=True)
class Joined:
    """Where a joining daemon was placed, and what a person should be told (``notes``)."""

    group: str | None
    limit: int | None
    notes: tuple[str, ...] = ()


class FleetPolicy:
    """Slots, resource groups and turns over the daemons of one sweep.

    Args:
        groups: the fleet file's group declarations (:class:`coordinator.fleet.GroupSettings`).
        endpoint_group: the implicit group of a shared endpoint (:func:`shared_endpoint`), or None.
        clock: monotonic seconds (injected; tests pass a fake).
        turn_wait_s: how long a member's READY keeps its turn (longer than its READY interval).
        co_tenancy: the spec declares co-tenancy (``hardware.co_tenancy``); without it a member that
            says how many devices it has (:meth:`join`'s ``devices``) holds at most one batch per device.
    """

    def __init__(self, groups: Sequence[GroupSettings] = (), endpoint_group: str | None = None,
                 clock: Callable[[], float] = time.monotonic, turn_wait_s: float = 2.0,
                 co_tenancy: bool = False) -> None:
        self.declared = tuple(groups)
        self.co_tenancy = co_tenancy
        self.endpoint_group = endpoint_group
        self.clock = clock
        self.turn_wait_s = turn_wait_s
        self.members: dict[str, Member] = {}
        self.groups: dict[str, Group] = {g.name: Group(g.name, g.group_max_concurrency) for g in groups}

    # ------------------------------------------------------------------ membership

    def join(self, daemon_id: str, hardware_class: str, max_concurrency: int = 1, group: str | None = None,
             group_max_concurrency: int | None = None, devices: int | None = None) -> Joined:
        """A daemon said HELLO (a new session replaces the old: nothing of it is running but the
        leases it adopts, which count through ``live``). ``devices``: its GPUs (0: a CPU-only node,
        one device); None: unknown, ``max_concurrency`` is taken as it is."""
        self.leave(daemon_id)
        notes: list[str] = []
        if devices is not None and not self.co_tenancy and max_concurrency > max(1, devices):
            cap = max(1, devices)
            notes.append(f"daemon {daemon_id} offers {max_concurrency} slots, sharing its {cap} device(s) (its owner "
                         f"allows co-tenancy); the spec does not declare hardware.co_tenancy: it is given at most "
                         f"{cap} batch(es) at a time, one per device")
            max_concurrency = cap
        matches = [g.name for g in self.declared if any(fnmatchcase(daemon_id, p) for p in g.daemons)]
        if len(matches) > 1:
            notes.append(f"daemon {daemon_id} matches fleet groups {', '.join(matches)}: it joins {matches[0]}, "
                         "the first (a daemon is in one group)")
        if matches:
            name: str | None = matches[0]
            if group is not None and group != name:
                notes.append(f"daemon {daemon_id} declares group {group!r}; the fleet file puts it in {name!r}")
        elif group is not None and (group in self.groups and self.groups[group].fleet_limit is not None
                                    or any(g.name == group for g in self.declared)
                                    or group.startswith(ENDPOINT_GROUP_PREFIX)):
            # A fleet-file (or spec) group is joined by the fleet file's patterns only, and an endpoint
            # group by measuring that endpoint: a daemon naming one itself could otherwise join its
            # rotation and lower its limit for every member.
            notes.append(f"daemon {daemon_id} declares group {group!r}, which the fleet declares without it (or "
                         f"which is a shared endpoint's): refused; its own group_max_concurrency is ignored")
            group, group_max_concurrency = None, None
        if not matches:
            name = group or self.endpoint_group
            if group is None and group_max_concurrency is not None:
                notes.append(f"daemon {daemon_id} declares group_max_concurrency={group_max_concurrency} without a "
                             "group of its own: ignored")
                group_max_concurrency = None
        m = Member(daemon_id, hardware_class, max_concurrency, name, group_max_concurrency)
        self.members[daemon_id] = m
        if name is None:
            return Joined(None, None, tuple(notes))
        g = self.groups.setdefault(name, Group(name))
        g.members.append(daemon_id)
        limit = self.limit(name)
        implicit = name == self.endpoint_group and not matches and group is None
        what = f"measures the shared endpoint {name[len(ENDPOINT_GROUP_PREFIX):]}" if implicit else "is declared"
        notes.append(f"daemon {daemon_id} {what}: resource group {name} ({len(g.members)} member(s): "
                     f"{', '.join(g.members)}) holds at most {limit} trial batch(es) at a time, taking turns")
        return Joined(name, limit, tuple(notes))

    def leave(self, daemon_id: str) -> None:
        m = self.members.pop(daemon_id, None)
        if m is not None and m.group is not None:
            g = self.groups[m.group]
            at = g.members.index(daemon_id)
            if g.last_turn == daemon_id:  # the rotation goes on after it, not from the first member
                g.last_turn = g.members[at - 1] if len(g.members) > 1 else None
            g.members.remove(daemon_id)

    def limit(self, group: str) -> int:
        """The group's limit: the tightest any declaration gives (fleet file, members), 1 if none."""
        g = self.groups[group]
        given = [g.fleet_limit] if g.fleet_limit is not None else []
        for d in g.members:
            declared = self.members[d].declared_limit
            if declared is not None:
                given.append(declared)
        return min(given) if given else DEFAULT_GROUP_MAX_CONCURRENCY

    def group_of(self, daemon_id: str) -> str | None:
        m = self.members.get(daemon_id)
        return m.group if m else None

    def slots(self, daemon_id: str) -> int:
        m = self.members.get(daemon_id)
        return m.max_concurrency if m else 1

    # ------------------------------------------------------------------ events

    def asked(self, daemon_id: str) -> None:
        """A READY from the daemon: it asks for work, and it is idle (what it was granted before
        and no longer holds a lease for has ended)."""
        m = self.members.get(daemon_id)
        if m is not None:
            m.asked_at = self.clock()
            m.settling = False

    def granted(self, daemon_id: str) -> None:
        m = self.members.get(daemon_id)
        if m is None:
            return
        m.asked_at = None
        m.settling = True
        if m.group is not None:
            self.groups[m.group].last_turn = daemon_id

    # ------------------------------------------------------------------ decisions

    def busy(self, daemon_id: str, live: Callable[[str], int]) -> int:
        """Batches counted against the daemon: its live leases, at least 1 while it settles."""
        m = self.members.get(daemon_id)
        n = live(daemon_id)
        return max(n, 1) if m is not None and m.settling else n

    def why_wait(self, daemon_id: str, live: Callable[[str], int], has_work: Callable[[str], bool]) -> str | None:
        """None when ``daemon_id`` may be granted a batch now; else why it must wait.

        ``live(daemon)``: the daemon's live leases (the lease table's count); ``has_work(class)``:
        whether work of that hardware class is queued."""
        m = self.members.get(daemon_id)
        if m is None:
            return None  # unknown to the policy (no HELLO seen): the control core decides
        busy = self.busy(daemon_id, live)
        if busy >= m.max_concurrency:
            return f"daemon {daemon_id} holds {busy} batch(es), its max_concurrency is {m.max_concurrency}"
        if m.group is None:
            return None
        g = self.groups[m.group]
        held = sum(self.busy(d, live) for d in g.members)
        limit = self.limit(g.name)
        if held >= limit:
            return f"resource group {g.name} holds {held} batch(es), its group_max_concurrency is {limit}"
        turn = self.next_turn(g.name, live, has_work)
        if turn is not None and turn != daemon_id:
            return f"resource group {g.name}: the turn of daemon {turn}"
        return None

    def next_turn(self, group: str, live: Callable[[str], int], has_work: Callable[[str], bool]) -> str | None:
        """The member whose turn it is: the first after the last one granted (round-robin in join
        order) that is asking, has a slot free and has work queued; None when none does."""
        g = self.groups[group]
        order = g.members
        if not order:
            return None
        start = order.index(g.last_turn) + 1 if g.last_turn in order else 0
        now = self.clock()
        for i in range(len(order)):
            m = self.members[order[(start + i) % len(order)]]
            asking = m.asked_at is not None and now - m.asked_at <= self.turn_wait_s
            if asking and self.busy(m.daemon_id, live) < m.max_concurrency and has_work(m.hardware_class):
                return m.daemon_id
        return None
