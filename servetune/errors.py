"""One exception root for the project; every error carries the context a person needs."""

from __future__ import annotations

from dataclasses import dataclass


class ServetuneError(Exception):
    """Root of every error servetune raises on purpose."""


@dataclass(frozen=True)
class SpecIssue:
    """One problem in an experiment spec: where (a YAML path such as ``engine.grid.max_num_seqs[1]``) and what."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path or '<root>'}: {self.message}"


class SpecError(ServetuneError, ValueError):
    """An experiment spec is invalid. ``issues`` lists every problem found, each with its YAML path."""

    def __init__(self, source: str, issues: list[SpecIssue]):
        self.source = source
        self.issues = list(issues)
        super().__init__(str(self))

    def __str__(self) -> str:
        lines = [f"invalid experiment spec {self.source}: {len(self.issues)} problem(s)"]
        lines += [f"  - {issue}" for issue in self.issues]
        return "\n".join(lines)


class ProtocolError(ServetuneError):
    """A wire message was malformed, too large, or of an unknown type or version."""


class ExperimentNotFoundError(ServetuneError, FileNotFoundError):
    """An EXPERIMENT argument named neither a spec file nor an experiment under the results root."""
