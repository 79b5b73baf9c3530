"""A bounded YAML loader and a bounded reader of regular files, for specs and what they point to.

YAML lets a small file describe a huge value: an alias (``*name``) repeats the node it names, so
nine lines of nested aliases expand to a billion values (an "alias bomb"), and nesting can go
deeper than Python's recursion limit. :func:`load_yaml` refuses, before building any value:

- text over :data:`MAX_SPEC_BYTES` (callers reading a file check its size before reading it:
  :func:`read_regular_file`);
- nesting deeper than :data:`MAX_DEPTH` levels, counted while composing with an explicit stack
  (so a 50,000-deep file is refused at level 65, or by libyaml's own limit of 1,000 flow levels,
  never by a ``RecursionError``) and again with aliases followed;
- more than :data:`MAX_ALIASES` aliases, or a document that expands to more than
  :data:`MAX_NODES` values once every alias is followed (counted on the node graph with each
  shared node measured once, so counting an alias bomb costs what its text costs);
- an alias inside the node it names (a recursive structure);
- the same key twice in one mapping (YAML would silently keep the last one); a ``<<`` merge key
  may still override merged keys, as YAML defines;
- a NUL character in any string (no path, name or environment value may hold one).

Every refusal is a :class:`YamlRefused` naming the YAML path (``load_points[0].dataset``) and the
line. :func:`read_regular_file` opens a path without blocking (a FIFO never hangs the caller),
accepts only a regular file of at most the given size, and reads no more than that.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Hashable, Iterator
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

#: The largest spec file read, in bytes (1 MiB; the largest example spec is about 3 KB).
MAX_SPEC_BYTES = 1 << 20
#: The deepest nesting of mappings and lists accepted (a spec needs about 6 levels).
MAX_DEPTH = 64
#: The most values (scalars, lists and mappings) a document may expand to with every alias followed.
MAX_NODES = 100_000
#: The most aliases (``*name``) a document may use.
MAX_ALIASES = 1_000

_MERGE_TAG = "tag:yaml.org,2002:merge"
Segment = str | int


class YamlRefused(ValueError):
    """A YAML document (or a file) was refused before it was built: ``path`` is where (a YAML
    path such as ``load_points[0].dataset``, empty for the whole document), ``message`` why."""

    def __init__(self, path: str, message: str):
        self.path = path
        self.message = message
        super().__init__(f"{path or '<root>'}: {message}")


def render_path(segments: list[Segment]) -> str:
    """``["load_points", 0, "dataset"]`` -> ``load_points[0].dataset``."""
    out = ""
    for part in segments:
        out += f"[{part}]" if isinstance(part, int) else ("." if out else "") + part
    return out


def _where(node_or_mark: Any) -> str:
    mark = getattr(node_or_mark, "start_mark", node_or_mark)
    line = getattr(mark, "line", None)
    return f" (line {line + 1})" if isinstance(line, int) else ""


#: libyaml's parser (C, no recursion) where PyYAML was built with it, else PyYAML's own.
_Loader: type = yaml.CSafeLoader if getattr(yaml, "__with_libyaml__", False) else yaml.SafeLoader


class _Frame:
    __slots__ = ("node", "key")

    def __init__(self, node: SequenceNode | MappingNode):
        self.node = node
        self.key: Node | None = None  # a mapping's key waiting for its value

    def segment(self) -> Segment | None:
        if isinstance(self.node, SequenceNode):
            return len(self.node.value)
        return str(self.key.value) if isinstance(self.key, ScalarNode) else None


def _compose(loader: Any) -> Node | None:
    """The node graph of the one document in ``loader``'s event stream, built without recursion
    (an explicit stack), refusing depth, aliases and anchors as :func:`load_yaml` says."""
    stack: list[_Frame] = []
    anchors: dict[str, Node] = {}
    aliases = 0
    created = 0
    root: Node | None = None

    def path() -> str:
        return render_path([s for s in (f.segment() for f in stack[:MAX_DEPTH]) if s is not None])

    def attach(node: Node) -> None:
        nonlocal root
        if not stack:
            root = node
            return
        top = stack[-1]
        if isinstance(top.node, SequenceNode):
            top.node.value.append(node)
        elif top.key is None:
            top.key = node
        else:
            top.node.value.append((top.key, node))
            top.key = None

    loader.get_event()  # stream start
    if loader.check_event(yaml.StreamEndEvent):
        return None
    loader.get_event()  # document start
    while True:
        event = loader.get_event()
        if isinstance(event, yaml.DocumentEndEvent):
            break
        if isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
            frame = stack.pop()
            frame.node.end_mark = event.end_mark
            attach(frame.node)
            continue
        if isinstance(event, yaml.AliasEvent):
            aliases += 1
            if aliases > MAX_ALIASES:
                raise YamlRefused(path(), f"more than {MAX_ALIASES} aliases (*name){_where(event)}")
            if event.anchor not in anchors:
                raise YamlRefused(path(), f"alias *{event.anchor} names no anchor{_where(event)}")
            attach(anchors[event.anchor])
            continue
        created += 1
        if created > MAX_NODES:
            raise YamlRefused(path(), f"holds more than {MAX_NODES:,} values{_where(event)}")
        tag = event.tag
        node: Node
        if isinstance(event, yaml.ScalarEvent):
            if tag is None or tag == "!":
                tag = loader.resolve(ScalarNode, event.value, event.implicit)
            node = ScalarNode(tag, event.value, event.start_mark, event.end_mark,  # type: ignore[arg-type]
                              style=event.style)
        else:
            kind = SequenceNode if isinstance(event, yaml.SequenceStartEvent) else MappingNode
            if tag is None or tag == "!":
                tag = loader.resolve(kind, None, event.implicit)
            node = kind(tag, [], event.start_mark, None, flow_style=event.flow_style)
        if event.anchor is not None:
            if event.anchor in anchors:
                raise YamlRefused(path(), f"anchor &{event.anchor} is defined twice{_where(event)}")
            anchors[event.anchor] = node
        if isinstance(node, ScalarNode):
            attach(node)
            continue
        stack.append(_Frame(node))  # type: ignore[arg-type]
        if len(stack) > MAX_DEPTH:
            raise YamlRefused(path(), f"nested deeper than {MAX_DEPTH} levels{_where(event)}")
    if not loader.check_event(yaml.StreamEndEvent):
        raise YamlRefused("", f"expected one YAML document, found another{_where(loader.peek_event())}")
    return root


class _GraphCheck:
    """One pass over the composed node graph, each shared node measured once: expanded size,
    depth with aliases followed, recursion, duplicate keys and NUL characters."""

    def __init__(self, loader: Any):
        self.loader = loader
        self.memo: dict[int, tuple[int, int]] = {}  # id(node) -> (expanded size, height)
        self.active: set[int] = set()

    def measure(self, node: Node, path: list[Segment]) -> tuple[int, int]:
        key = id(node)
        if key in self.active:
            raise YamlRefused(render_path(path), f"an alias refers to a node that contains it (a recursive "
                                                 f"structure){_where(node)}")
        found = self.memo.get(key)
        if found is None:
            if len(path) > MAX_DEPTH:
                raise YamlRefused(render_path(path[:MAX_DEPTH]), f"nested deeper than {MAX_DEPTH} levels once aliases "
                                                                 f"are followed{_where(node)}")
            self.active.add(key)
            found = self._measure_new(node, path)
            self.active.discard(key)
            self.memo[key] = found
        if len(path) + found[1] > MAX_DEPTH:
            raise YamlRefused(render_path(path), f"nested deeper than {MAX_DEPTH} levels once aliases are "
                                                 f"followed{_where(node)}")
        return found

    def _measure_new(self, node: Node, path: list[Segment]) -> tuple[int, int]:
        size, height = 1, 0
        if isinstance(node, ScalarNode):
            if "\x00" in node.value:
                raise YamlRefused(render_path(path), f"contains a NUL character{_where(node)}")
            return size, height
        for segment, child in self._children(node, path):
            child_size, child_height = self.measure(child, [*path, segment])
            size += child_size
            height = max(height, child_height + 1)
            if size > MAX_NODES:
                raise YamlRefused(render_path(path), f"expands to more than {MAX_NODES:,} values once its aliases "
                                                     f"(*name) are followed{_where(node)}")
        return size, height

    def _children(self, node: Node, path: list[Segment]) -> Iterator[tuple[Segment, Node]]:
        if isinstance(node, SequenceNode):
            yield from enumerate(node.value)
            return
        assert isinstance(node, MappingNode)
        first: dict[Hashable, Node] = {}
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG:
                yield "<<", value_node
                continue
            yield "<key>", key_node
            label: Segment = "<key>"
            if isinstance(key_node, ScalarNode):
                key = self.loader.construct_object(key_node, deep=True)
                label = str(key)
                if isinstance(key, Hashable):
                    if key in first:
                        raise YamlRefused(render_path([*path, label]), (
                            f"duplicate key {key!r} (first at line {first[key].start_mark.line + 1}, again at line "
                            f"{key_node.start_mark.line + 1}): YAML would keep only the last; remove one"))
                    first[key] = key_node
            yield label, value_node


def load_yaml(text: str) -> Any:
    """Parse one YAML document with the limits above. Raises :class:`YamlRefused` for what they
    refuse and ``yaml.YAMLError`` (or ``ValueError``, e.g. an integer of 5,000 digits) for
    malformed YAML."""
    if len(text) > MAX_SPEC_BYTES or len(text.encode("utf-8", "surrogatepass")) > MAX_SPEC_BYTES:
        raise YamlRefused("", f"larger than {MAX_SPEC_BYTES:,} bytes")
    loader = _Loader(text)
    try:
        try:
            node = _compose(loader)
        except yaml.YAMLError as exc:
            if "maximum nesting depth" not in str(exc):
                raise
            raise YamlRefused("", f"nested deeper than {MAX_DEPTH} levels{_where(getattr(exc, 'problem_mark', None))}"
                              ) from None
        if node is None:
            return None
        _GraphCheck(loader).measure(node, [])
        return loader.construct_document(node)
    finally:
        loader.dispose()


def read_regular_file(path: str | os.PathLike[str], max_bytes: int, *, what: str = "file") -> bytes:
    """The bytes of ``path`` if it is a regular file of at most ``max_bytes`` bytes (see
    :func:`iter_regular_file`)."""
    return b"".join(iter_regular_file(path, max_bytes, what=what))


def iter_regular_file(path: str | os.PathLike[str], max_bytes: int, *, what: str = "file") -> Iterator[bytes]:
    """The bytes of ``path`` in chunks of up to 1 MiB, if it is a regular file of at most ``max_bytes``.

    Opened with ``O_NONBLOCK`` and checked on the open descriptor (so a FIFO neither blocks nor
    slips in between a check and the open); a device such as ``/dev/zero``, a FIFO, a socket or a
    folder is refused before anything is read, and at most ``max_bytes + 1`` bytes are ever read.
    Raises :class:`YamlRefused` (path empty; ``what`` names the file in the message) or
    ``OSError`` (missing, unreadable)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise YamlRefused("", f"{os.fspath(path)} is not a regular file ({_kind(info.st_mode)}): a {what} must be one")
        if info.st_size > max_bytes:
            raise YamlRefused("", f"{os.fspath(path)} is {info.st_size:,} bytes; a {what} may hold at most "
                                  f"{max_bytes:,}")
        total = 0
        while total <= max_bytes:
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - total))
            if not chunk:
                return
            total += len(chunk)
            if total > max_bytes:
                raise YamlRefused("", f"{os.fspath(path)} grew past {max_bytes:,} bytes while it was read")
            yield chunk
    finally:
        os.close(fd)


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"
