"""A daemon's slots: which batches run at once, and on which GPUs (pure bookkeeping, no NVML, no clock).

:class:`SlotPool` holds the GPU sets (:mod:`daemon.gpusets`) of the batches a daemon runs now.

- **Capacity** (what the daemon advertises as ``max_concurrency``): the number of single-GPU sets
  :func:`~daemon.gpusets.gpu_sets` hands out for the ``--max-concurrency`` asked, i.e. at most one
  batch per GPU, and one batch on a CPU-only node (one device), unless the node's owner allows
  co-tenancy (``--co-tenancy``): then the asked number, sharing devices.
- **Co-tenancy takes two.** A device is shared only where the owner allows it (the pool's
  ``co_tenancy``) *and* the experiment declares it (the spec's ``hardware.co_tenancy``, carried in
  each GRANT as ``co_tenancy``, passed to :meth:`SlotPool.claim`): the new batch and every batch
  running on the devices it would share must all have been granted with it.
- **Claims.** A batch of ``tensor_parallel_size`` *tp* claims the best set (NVLink first) of *tp*
  GPUs that no running batch uses. With co-tenancy declared and too few free GPUs, it shares the
  best set of the node's GPUs (the set is marked ``shared``). A *tp* larger than the node claims
  every GPU (vLLM is then given them all and says for itself that the config cannot run here).
  A claim that finds no set returns None: the batch waits (:class:`daemon.session.DaemonSession`
  keeps its leases, renewed by heartbeats, and starts it when a running batch releases its GPUs).
- **Free slots** (READY's ``free_slots``): how many more single-GPU batches could start now.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace

from daemon.gpusets import GPUSet, gpu_sets
from servetune.result import Fingerprint, GPULink


@dataclass(frozen=True)
class Claim:
    """The GPUs batch ``batch_id`` runs on. ``gpu_set``: its ``CUDA_VISIBLE_DEVICES`` set; None on a
    CPU-only node or when the batch needs more GPUs than the node has (then it holds them all)."""

    batch_id: str
    gpu_set: GPUSet | None
    gpus: tuple[int, ...]
    #: GPUs of the set another running batch held when it was claimed (declared co-tenancy only).
    co_tenanted: tuple[int, ...] = ()
    #: Its GRANT declared co-tenancy (the spec's ``hardware.co_tenancy``): others may share its devices.
    allows_sharing: bool = False

    @property
    def shared(self) -> bool:
        return self.gpu_set is not None and self.gpu_set.shared


class SlotPool:
    """The slots and GPU sets of one daemon (see the module docstring for the rules)."""

    def __init__(self, gpus: Sequence[int], links: Sequence[GPULink], max_concurrency: int = 1,
                 co_tenancy: bool = False):
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        self.gpus = tuple(sorted(set(gpus)))
        self.links = list(links)
        self.requested = max_concurrency
        self.co_tenancy = co_tenancy
        self.capacity = len(gpu_sets(self.gpus, self.links, 1, max_concurrency, co_tenancy))
        self.claims: dict[str, Claim] = {}

    @classmethod
    def for_fingerprint(cls, fp: Fingerprint, max_concurrency: int = 1, co_tenancy: bool = False) -> SlotPool:
        links = fp.gpu_topology.links if fp.gpu_topology else []
        return cls([g.index for g in fp.gpus], links, max_concurrency, co_tenancy)

    def _in_use(self) -> Counter[int]:
        return Counter(g for claim in self.claims.values() for g in claim.gpus)

    def _may_share(self, declared: bool, gpus: Sequence[int] | None = None) -> bool:
        """Whether a batch granted with ``declared`` co-tenancy may share ``gpus`` (None: the node's
        one CPU device) with the running batches there: the owner allows it, and so do they all."""
        if not (self.co_tenancy and declared):
            return False
        on = [c for c in self.claims.values() if gpus is None or set(c.gpus) & set(gpus)]
        return all(c.allows_sharing for c in on)

    def _fit(self, batch_id: str, tensor_parallel_size: int | None, declared: bool) -> Claim | None:
        size = tensor_parallel_size or 1
        if len(self.claims) >= self.capacity:
            return None
        if not self.gpus:  # CPU-only: one device
            return Claim(batch_id, None, ()) if not self.claims or self._may_share(declared) else None
        in_use = self._in_use()
        if size > len(self.gpus):
            return Claim(batch_id, None, self.gpus) if not in_use or self._may_share(declared, self.gpus) else None
        free = [g for g in self.gpus if not in_use[g]]
        if len(free) >= size:
            chosen = gpu_sets(free, self.links, size)[0]
            return Claim(batch_id, chosen, chosen.gpus)
        best = gpu_sets(self.gpus, self.links, size)[0]
        if not self._may_share(declared, best.gpus):
            return None
        return Claim(batch_id, GPUSet(best.gpus, nvlink=best.nvlink, shared=True), best.gpus,
                     tuple(g for g in best.gpus if in_use[g]))

    def claim(self, batch_id: str, tensor_parallel_size: int | None, co_tenancy: bool = False) -> Claim | None:
        """Claim GPUs for ``batch_id`` now, or None when no set is free (it must wait).
        ``co_tenancy``: its GRANT declares co-tenancy (the spec's ``hardware.co_tenancy``); a device
        is shared only when that, the owner's ``co_tenancy`` and every batch already on it allow it."""
        if batch_id in self.claims:
            return self.claims[batch_id]
        claim = self._fit(batch_id, tensor_parallel_size, co_tenancy)
        if claim is not None:
            claim = replace(claim, allows_sharing=co_tenancy)
            self.claims[batch_id] = claim
        return claim

    def release(self, batch_id: str) -> None:
        self.claims.pop(batch_id, None)

    def free_slots(self) -> int:
        """How many more single-GPU batches could start now."""
        room = self.capacity - len(self.claims)
        if room <= 0:
            return 0
        if not self.gpus or self.co_tenancy:  # (a CPU-only node without co-tenancy has capacity 1)
            if self.claims and not all(c.allows_sharing for c in self.claims.values()):
                return 0 if not self.gpus else min(room, sum(1 for g in self.gpus if not self._in_use()[g]))
            return room
        in_use = self._in_use()
        return min(room, sum(1 for g in self.gpus if not in_use[g]))
