"""The spec's ``hardware`` section: which hardware an experiment measures, and where a trial may fail over.

A hardware class is named as ``daemon/fingerprint.py`` names it (``1xH100-80GB``,
``2xA100-80GB+1xT4-15GB``, ``cpu-16c-AVX512``). A spec may name several **targets**, each one
hardware class:

- ``{hardware_class: 1xH100-80GB}``: exactly that class;
- a **filter** ``{name: a100s, gpu_model: "*A100*", min_gpu_memory_gib: 40, gpu_count: 2}``: the
  first hardware class that joins and matches it (the rule is :mod:`coordinator.targets`'s).
  ``gpu_model`` is a case-insensitive glob over each GPU's model name; ``gpu_model_regex`` a
  Python regular expression that must match the whole name (give one or the other, or neither).

``failover_to`` maps a target (its class, or a filter's ``name``) to the hardware classes the
experiment declares interchangeable with it, in order of preference: only there may the
trials of a target with no daemon in service move (:func:`coordinator.targets.failover_work`).

``co_tenancy: true`` declares that two batches of this experiment may share one device (a GPU, or
a CPU-only node) on one daemon; without it a daemon runs at most one batch per device, whatever it
offers. It is carried to the daemon in every GRANT (``Grant.co_tenancy``), and the node's owner
must allow it too (``daemon start --co-tenancy``): a device is shared only where both do.

``groups`` declares resource groups (``{name, daemons, group_max_concurrency}``, the shape of the
fleet file's ``groups``: :mod:`coordinator.fleet`): daemons that share hardware or one endpoint and
hold at most ``group_max_concurrency`` batches between them (1 when none is given). They are
merged with the fleet file's (:func:`coordinator.fleet.merge_groups`): a group named in both gets
the daemons of both and the tightest limit either gives.

``targets`` may be left out (a section with only ``co_tenancy`` or ``groups``): then, as with no
section, every class is measured and no manifest changes.

With no ``hardware`` section the experiment measures whatever class takes each batch, as before,
and no manifest, trial id or spec hash changes. With a section, every (config, load point,
repeat) is planned once per target and the target is part of each trial's manifest
(:attr:`servetune.manifest.TrialManifest.hardware_target`): a class target as its class name, a
filter as ``filter:<name>``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator

HARDWARE_CLASS_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,199}$")
#: How a filter target is named in a manifest (and pinned until a class matching it joins): a
#: prefix no hardware class can carry (``:`` is outside :data:`HARDWARE_CLASS_PATTERN`).
FILTER_PREFIX = "filter:"
TARGET_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$"


def _hardware_class_name(value: str) -> str:
    if not HARDWARE_CLASS_PATTERN.match(value):
        raise ValueError(f"{value!r} is not a hardware class name: write it as the daemon's fingerprint does, "
                         "e.g. 1xH100-80GB, 2xA100-80GB+1xT4-15GB or cpu-16c-AVX512")
    return value


def _regex(value: str) -> str:
    try:
        re.compile(value)
    except re.error as exc:
        raise ValueError(f"gpu_model_regex {value!r} is not a regular expression: {exc}") from None
    return value


#: A hardware class as ``daemon/fingerprint.py`` names it: ``1xH100-80GB``, ``2xA100-80GB+1xT4-15GB``,
#: ``cpu-16c-AVX512``.
HardwareClassName = Annotated[str, AfterValidator(_hardware_class_name)]
TargetName = Annotated[str, StringConstraints(pattern=TARGET_NAME_PATTERN)]
_FILTER_KEYS = ("gpu_model", "gpu_model_regex", "min_gpu_memory_gib", "gpu_count")


class HardwareTarget(BaseModel):
    """One target: a ``hardware_class``, or a filter (a ``name`` and at least one of ``gpu_model``,
    ``gpu_model_regex``, ``min_gpu_memory_gib`` (per GPU), ``gpu_count`` (exactly this many GPUs))."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    hardware_class: HardwareClassName | None = None
    name: TargetName | None = Field(None, description="a filter's name (in manifests as filter:<name>)")
    gpu_model: Annotated[str, StringConstraints(min_length=1, max_length=200)] | None = Field(
        None, description="case-insensitive glob over each GPU's model name, e.g. '*H100*'")
    gpu_model_regex: Annotated[str, StringConstraints(min_length=1, max_length=200), AfterValidator(_regex)] | None = (
        Field(None, description="regular expression matching each GPU's whole model name"))
    min_gpu_memory_gib: float | None = Field(None, gt=0, le=100_000, description="each GPU has at least this much")
    gpu_count: int | None = Field(None, ge=1, le=1024, description="the node has exactly this many GPUs")

    @model_validator(mode="after")
    def _one_kind(self) -> HardwareTarget:
        filters = [k for k in _FILTER_KEYS if getattr(self, k) is not None]
        if self.hardware_class is not None:
            if self.name is not None or filters:
                extra = ", ".join(["name", *filters] if self.name is not None else filters)
                raise ValueError(f"a target names a hardware_class or is a filter, not both: remove {extra} "
                                 f"(or hardware_class {self.hardware_class!r})")
            return self
        if self.name is None:
            raise ValueError("a target needs hardware_class, or a filter's name with at least one of "
                             f"{', '.join(_FILTER_KEYS)}")
        if not filters:
            raise ValueError(f"filter target {self.name!r} filters nothing: give at least one of {', '.join(_FILTER_KEYS)}")
        if self.gpu_model is not None and self.gpu_model_regex is not None:
            raise ValueError(f"filter target {self.name!r}: give gpu_model (a glob) or gpu_model_regex, not both")
        return self

    @property
    def is_filter(self) -> bool:
        return self.hardware_class is None

    @property
    def label(self) -> str:
        """How manifests name this target: the class, or ``filter:<name>``."""
        return self.hardware_class if self.hardware_class is not None else f"{FILTER_PREFIX}{self.name}"

    @property
    def key(self) -> str:
        """How the spec refers to this target (``failover_to``): the class, or the filter's name."""
        return self.hardware_class if self.hardware_class is not None else str(self.name)


#: A resource group's name: a short label, no ``:`` (``endpoint:URL`` names a shared endpoint's implicit group).
GROUP_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"


def _is_pattern(daemon: str) -> bool:
    return any(c in daemon for c in "*?[")


def groups_problem(groups: Sequence[ResourceGroup], where: str = "groups") -> str | None:
    """Why ``groups`` cannot stand together (a name twice, a daemon id named by two groups), or None."""
    names = [g.name for g in groups]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        return f"{where}: the name {twice[0]!r} is declared more than once"
    owner: dict[str, str] = {}
    for g in groups:
        for d in g.daemons:
            if not _is_pattern(d):
                if d in owner and owner[d] != g.name:
                    return f"{where}: daemon {d!r} is named by groups {owner[d]!r} and {g.name!r}; a daemon is in one group"
                owner[d] = g.name
    return None


class ResourceGroup(BaseModel):
    """One resource group (the spec's ``hardware.groups`` or the fleet file's ``groups``); unknown keys
    are refused. ``daemons``: ids or ``fnmatch`` patterns; ``group_max_concurrency`` None: not declared
    here (a member's HELLO may declare it; 1 when nothing does)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=GROUP_NAME)
    daemons: list[Annotated[str, Field(min_length=1, max_length=128)]] = Field(min_length=1, max_length=1024)
    group_max_concurrency: int | None = Field(None, ge=1, le=1024)


class HardwareSpec(BaseModel):
    """The ``hardware`` section: ``targets`` (none: any class), the declared ``failover_to``,
    ``co_tenancy`` and resource ``groups``."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    targets: list[HardwareTarget] = Field(default_factory=list, max_length=64)
    failover_to: dict[Annotated[str, StringConstraints(min_length=1, max_length=200)], Annotated[list[HardwareClassName], Field(min_length=1, max_length=16)]] = Field(
        default_factory=dict,
        description="target (class or filter name) -> hardware classes declared interchangeable with it, preferred first",
    )
    co_tenancy: bool = Field(False, description="two batches may share one device of a daemon (where its owner allows)")
    groups: list[ResourceGroup] = Field(default_factory=list, max_length=256,
                                        description="resource groups, merged with the fleet file's")

    @field_validator("targets")
    @classmethod
    def _targets_given(cls, value: list[HardwareTarget]) -> list[HardwareTarget]:
        if not value:  # (left out, the default is not validated: any class)
            raise ValueError("give at least 1 target, or leave targets out to measure any class")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> HardwareSpec:
        keys = [t.key for t in self.targets]
        for i, key in enumerate(keys):
            if keys.index(key) != i:
                raise ValueError(f"targets[{i}]: target {key!r} is named twice")
        for source, classes in self.failover_to.items():
            if source not in keys:
                raise ValueError(f"failover_to.{source}: {source!r} is not a target; targets: {', '.join(keys)}")
            if source in classes:
                raise ValueError(f"failover_to.{source}: a class cannot fail over to itself")
            for i, c in enumerate(classes):
                if classes.index(c) != i:
                    raise ValueError(f"failover_to.{source}: {c!r} is listed twice")
        problem = groups_problem(self.groups)
        if problem:
            raise ValueError(problem)
        return self

    def labels(self) -> list[str]:
        """Each target's manifest label, in the spec's order."""
        return [t.label for t in self.targets]

    def target(self, label: str) -> HardwareTarget | None:
        """The target with manifest label (or spec key) ``label``, or None."""
        return next((t for t in self.targets if label in (t.label, t.key)), None)
