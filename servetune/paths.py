"""Where experiments live: the results root and how an EXPERIMENT argument is resolved."""

from __future__ import annotations

import os
from pathlib import Path

from servetune.errors import ExperimentNotFoundError

RESULTS_ROOT_ENV = "SERVETUNE_RESULTS_ROOT"
DEFAULT_RESULTS_ROOT = "runs"


def results_root(override: str | os.PathLike[str] | None = None) -> Path:
    """``override`` if given, else ``$SERVETUNE_RESULTS_ROOT``, else ``./runs``."""
    if override:
        return Path(override)
    return Path(os.environ.get(RESULTS_ROOT_ENV) or DEFAULT_RESULTS_ROOT)


def experiment_dir(name: str, root: str | os.PathLike[str] | None = None) -> Path:
    return results_root(root) / name


def resolve_experiment_dir(experiment: str | os.PathLike[str], root: str | os.PathLike[str] | None = None,
                           dataset_only: bool = False) -> Path:
    """Accept an experiment's name, its folder, or its spec file (YAML with a ``name``).

    An experiment folder holds ``experiment.sqlite`` (a sweep's store); with ``dataset_only`` (the
    readers: ``analysis.load``, ``report``, the notebooks) a folder holding only a ``results.nc`` (a
    dataset copied out of its experiment, or a synthetic one) counts too, as the dashboard lists it.
    Raises :class:`ExperimentNotFoundError` naming what was tried.
    """
    marks = ("experiment.sqlite", "results.nc") if dataset_only else ("experiment.sqlite",)

    def is_experiment(folder: Path) -> bool:
        return any((folder / m).exists() for m in marks)

    text = str(experiment)
    candidate = Path(text)
    if candidate.is_dir() and is_experiment(candidate):
        return candidate
    if candidate.is_file() and candidate.suffix in {".yaml", ".yml"}:
        # The same bounded loader as the spec's (size, depth, aliases): a spec path given here
        # is user input like any other.
        import yaml

        from servetune.yamlsafe import MAX_SPEC_BYTES, load_yaml, read_regular_file

        try:
            data = load_yaml(read_regular_file(candidate, MAX_SPEC_BYTES, what="experiment spec").decode("utf-8"))
        except (OSError, ValueError, yaml.YAMLError) as exc:  # YamlRefused is a ValueError
            raise ExperimentNotFoundError(f"cannot read experiment spec {candidate}: {exc}") from None
        name = data.get("name") if isinstance(data, dict) else None
        if not isinstance(name, str):
            raise ExperimentNotFoundError(f"spec {candidate} has no 'name'")
        text = name
    folder = experiment_dir(text, root)
    if is_experiment(folder):
        return folder
    looked = " or ".join(f"{folder}/{m}" for m in marks)
    raise ExperimentNotFoundError(f"no experiment {text!r} under results root {results_root(root)} (looked for {looked})")
