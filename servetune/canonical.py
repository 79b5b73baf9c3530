"""Canonical JSON and content hashes: the same value gives the same bytes on every machine."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def canonical_json(value: Any) -> str:
    """Compact JSON with sorted keys and no NaN; the form every id in servetune hashes."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def sha256_json(value: Any) -> str:
    """Hex sha256 of :func:`canonical_json` of ``value``."""
    return hashlib.sha256(canonical_json(value).encode("utf-8")).hexdigest()


def drop_added_defaults(data: dict[str, Any], added: dict[str, Any]) -> dict[str, Any]:
    """Remove from ``data`` (in place; returned) each dotted path of ``added`` whose value equals
    the default given there; a ``*`` segment stands for every item of a list. Fields added to a
    hashed record after ids were first made use this, so a record written before they existed
    keeps its id while the new field holds its default."""
    for path, default in added.items():
        _drop(data, path.split("."), default)
    return data


def _drop(node: Any, keys: list[str], default: Any) -> None:
    head, rest = keys[0], keys[1:]
    if head == "*":
        if isinstance(node, list) and rest:
            for item in node:
                _drop(item, rest, default)
        return
    if not isinstance(node, dict) or head not in node:
        return
    if rest:
        _drop(node[head], rest, default)
    elif node[head] == default:
        del node[head]


def restore_removed_fields(data: dict[str, Any], removed: dict[str, Any]) -> dict[str, Any]:
    """Set in ``data`` (in place; returned) each dotted path of ``removed`` to the value given there:
    a field taken out of a hashed record after ids were first made is put back with the value every
    record that can still be read held, so their ids do not change. Paths whose parent is missing
    are skipped."""
    for path, value in removed.items():
        *parents, last = path.split(".")
        node: Any = data
        for key in parents:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node[last] = value
    return data
