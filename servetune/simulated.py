"""How a SIMULATED trial is recognised and labelled, everywhere it is shown (pure, standard library).

A trial of the ``sim`` backend (:mod:`servetune.sim`) records ``backend`` ``sim`` and the hardware
class ``sim-<tp>x<PROFILE>`` (:func:`daemon.sim_backend.sim_fingerprint`), so it never shares a
hardware class with a measured trial. Planted data (:mod:`analysis.synthetic`) is neither: its
backend is ``synthetic`` and its dataset attribute ``synthetic`` is 1.

:func:`simulated_label` is the one wording every table, report, export and page uses; it names
the profiles and their calibration (GPU profiles: "uncalibrated (from published specs)").
:func:`export_provenance` puts that label first in an exported command's provenance comment.
:func:`mixed_message` is the refusal when simulated and measured trials would share a ranking,
a front or a decision.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from servetune.sim.profiles import PROFILE_NAMES, get_profile

SIM_BACKEND = "sim"
SIMULATED = "SIMULATED"
_SIM_CLASS = re.compile(r"^sim-(\d+)x(.+)$")


def sim_profile(hardware_class: str) -> str | None:
    """The profile of a simulated trial's hardware class (``sim-1xH100-80G`` -> ``H100-80G``), else None."""
    m = _SIM_CLASS.match(str(hardware_class))
    return m.group(2) if m else None


def is_simulated(backend: object = None, hardware_class: object = None) -> bool:
    """Whether one trial is simulated: its backend is ``sim`` or its class is a ``sim-`` class."""
    return str(backend) == SIM_BACKEND or sim_profile(str(hardware_class or "")) is not None


def simulated_label(hardware_classes: Iterable[object]) -> str:
    """``SIMULATED (profile H100-80G: uncalibrated (from published specs))`` for the simulated classes given
    (``SIMULATED`` alone when none names a known profile)."""
    profiles = sorted({p for p in (sim_profile(str(c)) for c in hardware_classes) if p is not None})
    parts = [f"{p}: {get_profile(p).calibration}" if p in PROFILE_NAMES else f"{p}: unknown profile"
             for p in profiles]
    if not parts:
        return SIMULATED
    return f"{SIMULATED} (profile {'; '.join(parts)})"


def export_provenance(provenance: Mapping[str, Any], hardware_classes: Iterable[object],
                      backends: Iterable[object] = ()) -> dict[str, Any]:
    """The provenance of an exported ``vllm serve`` command (or config), led by its SIMULATED label
    (``SIMULATED (profile ...)`` as the comment's first words) when any of the exported config's trials
    (their ``hardware_classes`` and ``backends``) is simulated, so a simulated winner is never pasted
    as if measured; ``provenance`` unchanged otherwise."""
    classes = [str(c) for c in hardware_classes]
    if not (any(str(b) == SIM_BACKEND for b in backends) or any(sim_profile(c) for c in classes)):
        return dict(provenance)
    detail = simulated_label(classes).removeprefix(SIMULATED).strip() or "(profile not recorded)"
    return {SIMULATED: detail, **provenance}


def mixed_message(what: str) -> str:
    """The refusal: simulated and measured trials never share ``what``."""
    return (f"simulated (backend sim) and measured trials never share {what}: analyse them apart "
            "(select one backend, or one hardware class)")
