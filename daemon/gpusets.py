"""GPU sets: which GPUs each concurrent trial of a node gets (a pure function, no NVML).

:func:`gpu_sets` hands out up to ``max_concurrency`` sets of ``tensor_parallel_size`` GPUs each,
as ``CUDA_VISIBLE_DEVICES`` strings. Sets are disjoint: one trial per GPU at a time, because a
trial sharing a GPU with another measures the other's load too. Only where co-tenancy is declared
(``co_tenancy=True``) does a node with too few GPUs for disjoint sets give further trials a set
already handed out (marked ``shared``). Among the possible sets, NVLink-connected ones come first
(every pair linked, then the most links, then the nearest PCIe path, then the lowest indices), so
a tensor-parallel trial is not measured over PCIe while an NVLink set sits idle. A CPU-only node
is one device: one set (empty ``CUDA_VISIBLE_DEVICES``), more only with co-tenancy.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations
from math import comb

from servetune.errors import ServetuneError
from servetune.result import Fingerprint, GPULink

#: Enumerate every candidate set only while there are at most this many; beyond, grow sets greedily.
MAX_COMBINATIONS = 20_000
#: PCIe paths from nearest to farthest (daemon.nvml.PATH_NAMES).
_PATH_RANK = {"internal": 0, "single PCIe switch": 1, "multiple PCIe switches": 2, "host bridge": 3,
              "NUMA node": 4, "system (across sockets)": 5}


class GPUSetError(ServetuneError):
    """A trial asks for more GPUs than the node has."""


@dataclass(frozen=True)
class GPUSet:
    gpus: tuple[int, ...]
    nvlink: bool = False  # every pair of the set NVLink-connected (a single GPU counts as connected)
    shared: bool = False  # handed out more than once (declared co-tenancy only)

    @property
    def cuda_visible_devices(self) -> str:
        return ",".join(map(str, self.gpus))


def _score(members: Sequence[int], links: dict[tuple[int, int], GPULink]) -> tuple[int, int, int, tuple[int, ...]]:
    """Sort key, smaller first: all pairs NVLinked, most links, nearest PCIe paths, lowest indices."""
    pairs = [links.get((a, b)) for a, b in combinations(sorted(members), 2)]
    nvlinked = all(p is not None and p.nvlinks > 0 for p in pairs)
    total = sum(p.nvlinks for p in pairs if p is not None)
    distance = sum(_PATH_RANK.get(p.path, 6) if p is not None else 6 for p in pairs)
    return (0 if nvlinked else 1, -total, distance, tuple(sorted(members)))


def _best_set(free: list[int], size: int, links: dict[tuple[int, int], GPULink]) -> tuple[int, ...]:
    if comb(len(free), size) <= MAX_COMBINATIONS:
        return min(combinations(free, size), key=lambda c: _score(c, links))
    chosen = [free[0]]  # greedy: grow from the lowest free GPU by the best-linked next one
    while len(chosen) < size:
        rest = [g for g in free if g not in chosen]
        chosen.append(min(rest, key=lambda g: _score([*chosen, g], links)))
    return tuple(sorted(chosen))


def gpu_sets(gpus: Sequence[int], links: Sequence[GPULink], tensor_parallel_size: int | None = None,
             max_concurrency: int = 1, co_tenancy: bool = False) -> list[GPUSet]:
    """Up to ``max_concurrency`` GPU sets of ``tensor_parallel_size`` (default 1) GPUs each.

    Disjoint unless ``co_tenancy``; fewer sets than ``max_concurrency`` when the GPUs run out (the
    node then runs fewer trials at once). Raises :class:`GPUSetError` when one set does not fit.
    """
    size = tensor_parallel_size or 1
    if size < 1 or max_concurrency < 1:
        raise ValueError(f"tensor_parallel_size and max_concurrency must be >= 1, got {size}, {max_concurrency}")
    if not gpus:  # CPU-only: the node is one device
        count = max_concurrency if co_tenancy else 1
        return [GPUSet((), nvlink=False, shared=count > 1) for _ in range(count)]
    ordered = sorted(set(gpus))
    if size > len(ordered):
        raise GPUSetError(f"tensor_parallel_size {size} needs {size} GPUs; this node has {len(ordered)} "
                          f"({','.join(map(str, ordered))})")
    by_pair = {(min(link.a, link.b), max(link.a, link.b)): link for link in links}
    free = list(ordered)
    sets: list[GPUSet] = []
    while len(sets) < max_concurrency and len(free) >= size:
        chosen = _best_set(free, size, by_pair)
        sets.append(GPUSet(chosen, nvlink=_score(chosen, by_pair)[0] == 0))
        free = [g for g in free if g not in chosen]
    if co_tenancy and len(sets) < max_concurrency:
        disjoint = list(sets)
        while len(sets) < max_concurrency:
            sets.append(disjoint[len(sets) % len(disjoint)])
        reused = {s.gpus for i, s in enumerate(sets) if s.gpus in {t.gpus for t in sets[:i]}}
        sets = [GPUSet(s.gpus, nvlink=s.nvlink, shared=s.gpus in reused) for s in sets]
    return sets


def batch_gpu_set(fingerprint: Fingerprint, tensor_parallel_size: int | None) -> GPUSet | None:
    """The GPU set a batch gets on a daemon that runs one batch at a time: the best set of
    ``tensor_parallel_size`` GPUs. None on a CPU-only node, or when the node has too few GPUs (then
    vLLM is given them all and says for itself that the config cannot run here)."""
    if not fingerprint.gpus:
        return None
    links = fingerprint.gpu_topology.links if fingerprint.gpu_topology else []
    try:
        return gpu_sets([g.index for g in fingerprint.gpus], links, tensor_parallel_size)[0]
    except GPUSetError:
        return None


def server_env(chosen: GPUSet | None, spec_env: Mapping[str, str], environ: Mapping[str, str] = os.environ
               ) -> dict[str, str]:
    """What a vLLM server on GPU set ``chosen`` gets in its environment: ``CUDA_VISIBLE_DEVICES`` and
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (so CUDA numbers GPUs as NVML does). Nothing on a CPU-only
    node, or where the spec or the node's operator already set ``CUDA_VISIBLE_DEVICES``."""
    if chosen is None or not chosen.gpus or "CUDA_VISIBLE_DEVICES" in spec_env or "CUDA_VISIBLE_DEVICES" in environ:
        return {}
    return {"CUDA_VISIBLE_DEVICES": chosen.cuda_visible_devices, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
