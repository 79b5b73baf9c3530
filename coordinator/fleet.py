"""Fleet settings: lease and heartbeat timings, how long to wait for daemons, the retry budget.

These are the coordinator's settings, not the experiment's: they come from ``sweep`` flags and an
optional fleet file (``--fleet FILE``, YAML with the keys below; flags win), never from the spec,
so changing them never changes a spec hash or a trial id.

=========================  ========  ==========================================================
key                        default   meaning
=========================  ========  ==========================================================
bind                       (none)    ROUTER address; default: a random loopback port for a local
                                     sweep, ``tcp://0.0.0.0:5555`` with ``--no-local-daemon``
heartbeat_interval_s       1.0       how often daemons heartbeat (told to them in WELCOME)
lease_ttl_s                30.0      a lease lives this long after its last renewal
lease_grace_s              5.0       extra wait past the TTL before a lease is revoked and its
                                     trials re-granted with epoch + 1 (the daemon fenced itself
                                     at the TTL, so it is stopped first)
suspect_after_missed       3         heartbeats missed before a daemon is shown as suspect
daemon_wait_s              300.0     with no daemon connected this long, the sweep ends with
                                     its holes listed (exit code 4)
max_transport_retries      3         attempts of one trial lost to transport or daemon errors in
                                     one sweep before it is left as a hole (exit code 3)
artifact_drain_s           60.0      once every result is in, how long the sweep still waits for
                                     artifacts in flight (logs, samples; it ends sooner when
                                     uploads are quiet); the rest stay spooled on the nodes
groups                     []        resource groups (:mod:`coordinator.policy`): daemons that
                                     share hardware or one endpoint, each ``{name, daemons,
                                     group_max_concurrency}``; ``daemons``: ids or ``fnmatch``
                                     patterns (a daemon joins the first group naming it); its
                                     members hold at most ``group_max_concurrency`` batches at once
                                     (the tightest limit the group or a member's HELLO declares;
                                     1 when none does) and take turns round-robin. An ``openai``
                                     endpoint that is not loopback is such a group on its own
                                     (``endpoint:URL``) for every daemon no group here names.
                                     The spec may declare groups too (``hardware.groups``,
                                     same shape): merged with these (:func:`merge_groups`;
                                     a group named in both: both lists of daemons, the
                                     tightest limit)
clock_probe_every_s        300.0     how often each daemon's clock offset is estimated again
                                     (Cristian's algorithm, coordinator/clock.py; also when it
                                     joins); the estimates go to ``runs/<name>/clock.json``
breaker_failures           3         consecutive transport failures of one daemon that open its
                                     circuit breaker (it is granted nothing; coordinator.breaker)
recovery_after_s           30.0      an open breaker's cool-down: then one probe batch; a class
                                     with no daemon in service for twice this is drained to holes
=========================  ========  ==========================================================

A daemon's own limit, ``max_concurrency`` (default 1), and optionally its ``group`` and
``group_max_concurrency``, come in its HELLO (:class:`servetune.messages.Capabilities`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from servetune.errors import SpecError, SpecIssue
from servetune.hardware import GROUP_NAME, ResourceGroup, groups_problem  # noqa: F401 (GROUP_NAME: re-exported)

DEFAULT_FLEET_PORT = 5555
DEFAULT_FLEET_BIND = f"tcp://0.0.0.0:{DEFAULT_FLEET_PORT}"
LOCAL_BIND = "tcp://127.0.0.1:0"


#: One resource group of the fleet file (the same model as the spec's ``hardware.groups``).
GroupSettings = ResourceGroup


def merge_groups(fleet: Sequence[GroupSettings], spec: Sequence[GroupSettings]) -> tuple[GroupSettings, ...]:
    """The resource groups of a sweep: the fleet file's, then the spec's (``hardware.groups``).

    A group named in both is one group: the fleet file's daemons, then the spec's, and the tightest
    ``group_max_concurrency`` either gives (None when neither does). Raises :class:`SpecError` when
    the merged groups cannot stand together (a daemon id named by two groups)."""
    spec_by_name = {g.name: g for g in spec}
    merged: list[GroupSettings] = []
    for g in fleet:
        other = spec_by_name.pop(g.name, None)
        if other is not None:
            limits = [x for x in (g.group_max_concurrency, other.group_max_concurrency) if x is not None]
            daemons = [*g.daemons, *(d for d in other.daemons if d not in g.daemons)]
            g = GroupSettings(name=g.name, daemons=daemons, group_max_concurrency=min(limits) if limits else None)
        merged.append(g)
    merged += [g for g in spec if g.name in spec_by_name]
    problem = groups_problem(merged, "groups (the fleet file's and the spec's hardware.groups together)")
    if problem:
        raise SpecError("resource groups", [SpecIssue("hardware.groups", problem)])
    return tuple(merged)


class FleetSettings(BaseModel):
    """Validated fleet settings; unknown keys are refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    bind: str | None = Field(None, pattern=r"^tcp://[^\s:]+:\d{1,5}$")
    heartbeat_interval_s: float = Field(1.0, gt=0, le=60)
    lease_ttl_s: float = Field(30.0, gt=0, le=3600)
    lease_grace_s: float = Field(5.0, ge=0, le=3600)
    suspect_after_missed: int = Field(3, ge=1, le=100)
    daemon_wait_s: float = Field(300.0, gt=0, le=7 * 86_400)
    max_transport_retries: int = Field(3, ge=1, le=100)
    #: How long a sweep whose results are all in still waits for artifacts in flight (coordinator.artifact_sink).
    artifact_drain_s: float = Field(60.0, ge=0, le=3600)
    #: Resource groups (coordinator.policy): daemons that hold a bounded number of batches between them.
    groups: tuple[GroupSettings, ...] = Field((), max_length=256)
    #: How often each daemon's clock offset is estimated again (coordinator.clock); also on join.
    clock_probe_every_s: float = Field(300.0, gt=0, le=86_400)

    @model_validator(mode="after")
    def _groups_distinct(self) -> FleetSettings:
        problem = groups_problem(self.groups)
        if problem:
            raise ValueError(problem)
        return self

    #: Circuit breaker (coordinator.breaker): N consecutive transport failures open it; the cool-down.
    breaker_failures: int = Field(3, ge=1, le=1000)
    recovery_after_s: float = Field(30.0, gt=0, le=86_400)

    @model_validator(mode="after")
    def _ttl_covers_heartbeats(self) -> FleetSettings:
        if self.lease_ttl_s < 2 * self.heartbeat_interval_s:
            raise ValueError(
                f"lease_ttl_s ({self.lease_ttl_s:g}) must be at least twice heartbeat_interval_s "
                f"({self.heartbeat_interval_s:g}), or every lease expires between two heartbeats"
            )
        return self

    @property
    def suspect_after_s(self) -> float:
        return self.suspect_after_missed * self.heartbeat_interval_s

    @property
    def revoke_after_s(self) -> float:
        """Silence after which a lease is revoked: TTL + grace."""
        return self.lease_ttl_s + self.lease_grace_s


def fleet_settings(path: Path | None = None, **overrides: Any) -> FleetSettings:
    """Settings from a fleet file (if given) with ``overrides`` (flags; ``None`` means unset) on top.
    Raises :class:`SpecError` naming each bad key."""
    data: dict[str, Any] = {}
    source = "fleet settings"
    if path is not None:
        source = str(path)
        try:
            loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise SpecError(source, [SpecIssue("", f"cannot read the fleet file: {exc}")]) from None
        except yaml.YAMLError as exc:
            raise SpecError(source, [SpecIssue("", f"not YAML: {exc}")]) from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise SpecError(source, [SpecIssue("", f"expected a mapping of settings, got {type(loaded).__name__}")])
        data.update(loaded)
    data.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return FleetSettings.model_validate(data)
    except ValidationError as exc:
        issues = [SpecIssue(".".join(str(p) for p in e["loc"]), e["msg"]) for e in exc.errors(include_url=False)]
        raise SpecError(source, issues) from None
