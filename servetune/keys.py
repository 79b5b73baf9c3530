"""CURVE key files and the coordinator's allow-list of daemon keys: pure file handling.

Everything lives under ``$SERVETUNE_HOME`` (default ``~/.servetune``)::

    coordinator/public.key     the coordinator's public key (Z85, 40 characters); daemons pin it
    coordinator/secret.key     its secret key, mode 0600
    coordinator/daemons.allow  the allow-list: one ``NAME KEY`` per line (lines starting with ``#`` are comments); the
                               coordinator re-reads it while a sweep runs
    daemon/public.key          this node's daemon public key (the line to ``keys add`` on the coordinator)
    daemon/secret.key          its secret key, mode 0600
    daemon/coordinator.key     the coordinator public key this daemon pins (``daemon keys init
                               --coordinator-key KEY``)

A secret file is created with ``os.open(..., 0o600)`` in the same folder, then renamed into place,
so it is never readable by others, not even for a moment, and never half-written. Folders are made
mode 0700.

Keys are ZeroMQ's Z85 text (40 characters of the Z85 alphabet = 32 bytes). A daemon's **key id**
(:func:`key_id`) is the first 16 hex digits of the SHA-256 of its Z85 public key: short enough for
a dataset coordinate, and what every attempt and ``results.nc`` row records as ``daemon_key_id``.

Key generation needs libzmq, which this core package does not import: callers pass a
``keypair()`` function (``zmq.curve_keypair``). Errors are :class:`KeyFileError` naming the file,
the name or the value that is wrong.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from servetune.errors import ServetuneError

HOME_ENV = "SERVETUNE_HOME"
DEFAULT_HOME = "~/.servetune"
ALLOW_FILE = "daemons.allow"
PUBLIC_FILE = "public.key"
SECRET_FILE = "secret.key"
COORDINATOR_KEY_FILE = "coordinator.key"

_Z85 = re.compile(r"^[0-9a-zA-Z.\-:+=^!/*?&<>()\[\]{}@%$#]{40}$")
_NAME = re.compile(r"^[A-Za-z0-9._@+-]{1,64}$")
_FLAG = re.compile(r"^--?[A-Za-z][A-Za-z0-9-]*$")

Keypair = Callable[[], tuple[bytes, bytes]]


class KeyFileError(ServetuneError):
    """A key file, key or allow-list entry is missing or malformed; the message names it."""


def servetune_home(override: str | os.PathLike[str] | None = None) -> Path:
    """``override`` if given, else ``$SERVETUNE_HOME``, else ``~/.servetune``."""
    if override:
        return Path(override)
    return Path(os.environ.get(HOME_ENV) or DEFAULT_HOME).expanduser()


def coordinator_dir(home: Path) -> Path:
    return home / "coordinator"


def daemon_dir(home: Path) -> Path:
    return home / "daemon"


def check_key(text: str, what: str = "key") -> str:
    """``text`` stripped, if it is a Z85 CURVE key; else :class:`KeyFileError` naming ``what`` and the value."""
    key = text.strip()
    if not _Z85.match(key):
        shown = key if len(key) <= 60 else key[:57] + "..."
        raise KeyFileError(f"{what} {shown!r} is not a CURVE public key (40 characters of Z85 text, as printed by "
                           "`keys show`)")
    return key


def shield_key_args(argv: Iterable[str]) -> list[str]:
    """``argv`` with every CURVE key that begins with ``-`` kept a value for argparse.

    One Z85 key in 85 begins with ``-``; argparse takes such a token for an option, so
    ``--coordinator-key -Hy...`` fails with "expected one argument" and ``keys add NAME -Hy...`` with
    a missing KEY. A leading space makes argparse see a value; :func:`check_key` strips it. Tokens that
    look like flags (letters, digits and dashes only) are left alone.
    """
    return [" " + arg if arg.startswith("-") and _Z85.match(arg) and not _FLAG.match(arg) else arg
            for arg in argv]


def check_name(name: str) -> str:
    if not _NAME.match(name):
        raise KeyFileError(f"daemon name {name!r}: must be 1-64 characters of A-Z a-z 0-9 . _ @ + -")
    return name


def key_id(public_key: str) -> str:
    """The short, stable id of a public key: the first 16 hex digits of SHA-256 of its Z85 text."""
    return hashlib.sha256(public_key.encode("ascii")).hexdigest()[:16]


# ---------------------------------------------------------------------- files


def _mkdir_private(folder: Path) -> None:
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` with mode 0600 from the first byte: a new file opened with
    ``O_CREAT | O_EXCL`` and mode 0600 next to it, fsynced, then renamed over ``path``."""
    _mkdir_private(path.parent)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="ascii") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o600)  # the umask may only have removed bits; make it exact
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _read_key(path: Path, what: str) -> str:
    try:
        text = path.read_text(encoding="ascii")
    except FileNotFoundError:
        raise KeyFileError(f"no {what} at {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise KeyFileError(f"cannot read {what} {path}: {exc}") from None
    return check_key(text, f"{what} in {path}:")


@dataclass(frozen=True)
class KeyPair:
    """A CURVE key pair as Z85 text."""

    public: str
    secret: str

    @property
    def key_id(self) -> str:
        return key_id(self.public)


def generate(keypair: Keypair) -> KeyPair:
    public, secret = keypair()
    return KeyPair(public=public.decode("ascii"), secret=secret.decode("ascii"))


def save_pair(folder: Path, pair: KeyPair) -> None:
    """Write ``pair`` into ``folder`` (secret first, mode 0600; the public key mode 0644)."""
    write_private(folder / SECRET_FILE, pair.secret + "\n")
    write_private(folder / PUBLIC_FILE, pair.public + "\n")
    os.chmod(folder / PUBLIC_FILE, 0o644)


def load_pair(folder: Path) -> KeyPair:
    """The key pair in ``folder``; :class:`KeyFileError` if a file is missing, malformed or the secret
    is readable by others."""
    secret_path = folder / SECRET_FILE
    if secret_path.exists() and secret_path.stat().st_mode & 0o077:
        raise KeyFileError(f"secret key {secret_path} is readable by others (mode "
                           f"{secret_path.stat().st_mode & 0o777:o}); run chmod 600 {secret_path}")
    return KeyPair(public=_read_key(folder / PUBLIC_FILE, "public key"),
                   secret=_read_key(secret_path, "secret key"))


def init_pair(folder: Path, keypair: Keypair, *, force: bool = False) -> tuple[KeyPair, bool]:
    """The pair in ``folder``, made now if there is none (or with ``force``). Returns it and whether it is new."""
    if not force and (folder / SECRET_FILE).exists():
        return load_pair(folder), False
    pair = generate(keypair)
    save_pair(folder, pair)
    return pair, True


def save_coordinator_key(home: Path, key: str) -> Path:
    """Pin ``key`` as the coordinator this node's daemon trusts."""
    path = daemon_dir(home) / COORDINATOR_KEY_FILE
    write_private(path, check_key(key, "--coordinator-key") + "\n")
    os.chmod(path, 0o644)
    return path


def pinned_coordinator_key(home: Path) -> str:
    """The coordinator public key a daemon pins: ``daemon/coordinator.key``, else (coordinator and
    daemon on one host) ``coordinator/public.key``; :class:`KeyFileError` saying how to set it."""
    pinned = daemon_dir(home) / COORDINATOR_KEY_FILE
    if pinned.exists():
        return _read_key(pinned, "coordinator key")
    own = coordinator_dir(home) / PUBLIC_FILE
    if own.exists():
        return _read_key(own, "coordinator public key")
    raise KeyFileError(f"no coordinator key: pass --coordinator-key KEY, or run `daemon keys init --coordinator-key "
                       f"KEY` (looked for {pinned} and {own})")


# ---------------------------------------------------------------------- allow-list


@dataclass(frozen=True)
class AllowEntry:
    name: str
    public_key: str

    @property
    def key_id(self) -> str:
        return key_id(self.public_key)


def allow_path(home: Path) -> Path:
    return coordinator_dir(home) / ALLOW_FILE


def parse_allow_list(text: str, source: str = ALLOW_FILE) -> list[AllowEntry]:
    """Entries of an allow-list (``NAME KEY`` per line). :class:`KeyFileError` names the line."""
    entries: list[AllowEntry] = []
    names: set[str] = set()
    keys: set[str] = set()
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):  # whole-line comments only: Z85 keys may contain '#'
            continue
        parts = line.split()
        if len(parts) != 2:
            raise KeyFileError(f"{source} line {n}: expected `NAME KEY`, got {line[:80]!r}")
        try:
            name, key = check_name(parts[0]), check_key(parts[1], f"key of {parts[0]!r}")
        except KeyFileError as exc:
            raise KeyFileError(f"{source} line {n}: {exc}") from None
        if name in names or key in keys:
            raise KeyFileError(f"{source} line {n}: {'name ' + name if name in names else 'key'} listed twice")
        names.add(name)
        keys.add(key)
        entries.append(AllowEntry(name, key))
    return entries


def read_allow_list(home: Path) -> list[AllowEntry]:
    """The coordinator's allow-list; empty if the file does not exist."""
    path = allow_path(home)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    except (OSError, UnicodeDecodeError) as exc:
        raise KeyFileError(f"cannot read the allow-list {path}: {exc}") from None
    return parse_allow_list(text, str(path))


def write_allow_list(home: Path, entries: Iterable[AllowEntry]) -> Path:
    path = allow_path(home)
    lines = ["# daemons this coordinator admits: NAME PUBLIC-KEY (python -m coordinator keys add|remove)"]
    lines += [f"{e.name} {e.public_key}" for e in entries]
    write_private(path, "\n".join(lines) + "\n")
    return path


def add_to_allow_list(home: Path, name: str, key: str) -> AllowEntry:
    """Admit ``key`` under ``name``; :class:`KeyFileError` if the name or key is already listed."""
    entry = AllowEntry(check_name(name), check_key(key, f"key for {name!r}"))
    entries = read_allow_list(home)
    for e in entries:
        if e.name == entry.name:
            raise KeyFileError(f"daemon name {name!r} is already in the allow-list (remove it first)")
        if e.public_key == entry.public_key:
            raise KeyFileError(f"key {entry.public_key} is already in the allow-list as {e.name!r}")
    write_allow_list(home, [*entries, entry])
    return entry


def remove_from_allow_list(home: Path, name: str) -> AllowEntry:
    """Drop ``name``; :class:`KeyFileError` listing the names there are if it is not listed."""
    entries = read_allow_list(home)
    gone = [e for e in entries if e.name == name]
    if not gone:
        known = ", ".join(e.name for e in entries) or "none"
        raise KeyFileError(f"no daemon named {name!r} in the allow-list {allow_path(home)} (names: {known})")
    write_allow_list(home, [e for e in entries if e.name != name])
    return gone[0]
