"""Who this node is: the cluster key it shares with its peers and its own persistent node id.

The key is a shared secret (the HMAC key of the handshake). It comes from ``--key``, then
``EXO_TUI_KEY``, then ``cluster.key`` in the config folder, which is created with mode 0600 on
first use. Only its fingerprint is ever published. A key that fewer than 2**128 guesses would
find is refused: anyone who records one handshake can test guesses offline.

The node id lives in ``node.json`` in the data folder beside a fingerprint of the machine that
created it. A folder copied to another machine, or a cloned disk image, carries the file along;
the machine fingerprint no longer matches there, so that machine makes itself a new id instead
of answering to its twin's.
"""

# pyright: strict

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import secrets
import socket
import stat
import uuid
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from engine.types import Frozen
from exo_tui.cluster.errors import IdentityError
from exo_tui.cluster.key_strength import MIN_KEY_BITS, guess_bits
from exo_tui.store import paths

log = logging.getLogger(__name__)

KEY_ENV = "EXO_TUI_KEY"
MIN_KEY_LENGTH = 16
_KEY_FINGERPRINT_SALT = b"exo-tui cluster key\0"
_MACHINE_FINGERPRINT_SALT = b"exo-tui machine\0"
_MACHINE_ID_FILES = (Path("/etc/machine-id"), Path("/var/lib/dbus/machine-id"))
# uuid.getnode() sets this bit when it found no hardware address and made up a random one.
_RANDOM_MAC_BIT = 1 << 40


class ClusterKey(Frozen):
    """The shared secret of one cluster. ``repr`` leaves the text out so logs never carry it."""

    text: str = Field(repr=False)

    @property
    def secret(self) -> bytes:
        return self.text.encode()

    @property
    def fingerprint(self) -> str:
        """Names the key without revealing it: safe to advertise over mDNS and to show."""
        return hashlib.sha256(_KEY_FINGERPRINT_SALT + self.secret).hexdigest()[:16]


class NodeIdentity(Frozen):
    node_id: str
    name: str


class _NodeFile(BaseModel):
    # Unknown fields are ignored rather than refused, so a newer exo-tui's file keeps its id.
    model_config = ConfigDict(frozen=True, extra="ignore")

    node_id: str = Field(pattern=r"^n-[0-9a-f]{12}$")
    machine: str


def key_path() -> Path:
    return paths.config_dir() / "cluster.key"


def node_path() -> Path:
    return paths.data_dir() / "node.json"


def load_cluster_key(explicit: str | None = None) -> ClusterKey:
    """The key given by flag, else by EXO_TUI_KEY, else the key file (made on first use)."""
    if explicit is not None:
        return parse_cluster_key(explicit, "the --key value")
    from_env = os.environ.get(KEY_ENV, "")
    if from_env.strip():
        return parse_cluster_key(from_env, KEY_ENV)
    path = key_path()
    stored = _read_key_file(path)
    if stored is not None:
        return stored
    fresh = generate_cluster_key()
    # If another process made the file first, everyone uses that one.
    if not _write_private(path, fresh.text + "\n", replace=False):
        return _read_key_file(path) or fresh
    return fresh


def replace_cluster_key() -> ClusterKey:
    """Write a fresh key over the key file; nodes holding the old one are refused from now on."""
    fresh = generate_cluster_key()
    _write_private(key_path(), fresh.text + "\n", replace=True)
    return fresh


def generate_cluster_key() -> ClusterKey:
    """256 random bits. zxcvbn could, in rare draws, see words in one and rate it under the bar;
    such a draw is thrown away, so a fresh key is always accepted."""
    while True:
        text = secrets.token_urlsafe(32)
        if guess_bits(text) >= MIN_KEY_BITS:
            return ClusterKey(text=text)


def parse_cluster_key(text: str, source: str) -> ClusterKey:
    """A key as the user gave it (surrounding whitespace dropped), or IdentityError saying why."""
    text = text.strip()
    fix = "Use the key that `exo-tui key` prints on a machine of the cluster"
    if not text:
        raise IdentityError(f"The cluster key from {source} is empty", fix)
    if not text.isascii():
        raise IdentityError(f"The cluster key from {source} has non-ASCII characters", fix)
    if any(char.isspace() for char in text):
        raise IdentityError(f"The cluster key from {source} has whitespace inside", fix)
    if not text.isprintable():
        raise IdentityError(f"The cluster key from {source} has control characters", fix)
    if len(text) < MIN_KEY_LENGTH:
        raise IdentityError(
            f"The cluster key from {source} has only {len(text)} characters; "
            f"a key needs at least {MIN_KEY_LENGTH}",
            fix,
        )
    bits = guess_bits(text)
    if bits < MIN_KEY_BITS:
        raise IdentityError(
            f"The cluster key from {source} is too easy to guess: about 2^{bits:.0f} guesses "
            f"would find it, and a key needs at least 2^{MIN_KEY_BITS} (anyone who records one "
            "handshake can test guesses offline)",
            "Run `exo-tui key --new` for a random key, and give every node the key it prints "
            f"(with `--key` or {KEY_ENV})",
        )
    return ClusterKey(text=text)


def _read_key_file(path: Path) -> ClusterKey | None:
    """The key in ``path`` (permissions tightened to 0600 first), or None when there is none."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return None
    except OSError as error:
        raise _unusable(path, error) from error
    if not stat.S_ISREG(mode):
        raise IdentityError(
            f"{path} is not a file", "Move it away so that a key file can be made there"
        )
    if stat.S_IMODE(mode) & 0o077:
        try:
            path.chmod(0o600)
        except OSError as error:
            raise _unusable(path, error) from error
        log.warning("%s was readable by other users; its mode is now 0600", path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise _unusable(path, error) from error
    try:
        return parse_cluster_key(text, str(path))
    except IdentityError as error:
        raise IdentityError(
            error.cause, "Run `exo-tui key --new` to replace it, or put the cluster's key in it"
        ) from error


def _unusable(path: Path, error: Exception) -> IdentityError:
    return IdentityError(
        f"Cannot use {path} ({error})",
        f"Check its permissions, or point {paths.HOME_ENV} at a folder you own",
    )


def load_node_identity(name: str | None = None) -> NodeIdentity:
    """This machine's node id, made on first use and remade when the file came from elsewhere."""
    name = name or socket.gethostname()
    path = node_path()
    machine = machine_fingerprint()
    stored = _read_node_file(path)
    if stored is not None and stored.machine == machine:
        return NodeIdentity(node_id=stored.node_id, name=name)
    if stored is not None:
        log.warning("%s was made on another machine; this machine takes a new node id", path)
    fresh = _NodeFile(node_id=f"n-{secrets.token_hex(6)}", machine=machine)
    # A stale or corrupt file is replaced; a missing one is created only if no other process
    # starting at the same moment created it first.
    if not _write_private(path, fresh.model_dump_json() + "\n", replace=path.exists()):
        winner = _read_node_file(path)
        if winner is not None and winner.machine == machine:
            fresh = winner
    return NodeIdentity(node_id=fresh.node_id, name=name)


def _read_node_file(path: Path) -> _NodeFile | None:
    """The stored node id, or None when the file is missing, unreadable or corrupt."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as error:
        log.warning("cannot read %s (%s); this node takes a new id", path, error)
        return None
    try:
        return _NodeFile.model_validate_json(raw)
    except ValidationError:
        log.warning("%s is corrupt; this node takes a new id", path)
        return None


def machine_fingerprint() -> str:
    """A stable digest of this machine: its machine-id, else its hostname and hardware address.

    Hashed with an exo-tui salt, so node.json never reveals the machine-id itself.
    """
    identity = _machine_id()
    if identity is None:
        mac = uuid.getnode()
        # A made-up address changes with every process; the hostname alone is at least stable.
        hardware = "" if mac & _RANDOM_MAC_BIT else f"{mac:012x}"
        identity = f"{socket.gethostname()}/{hardware}"
    return hashlib.sha256(_MACHINE_FINGERPRINT_SALT + identity.encode()).hexdigest()[:16]


def _machine_id() -> str | None:
    for path in _MACHINE_ID_FILES:
        try:
            value = path.read_text(encoding="ascii", errors="replace").strip()
        except OSError:
            continue
        # systemd leaves it empty (or "uninitialized") in images meant to be cloned.
        if value and value != "uninitialized":
            return value
    return None


def _write_private(path: Path, text: str, *, replace: bool) -> bool:
    """Write ``text`` to ``path`` atomically with mode 0600; False when ``path`` existed and
    ``replace`` is off (the file there is left alone).

    The text goes to a temporary file in the same folder first, so a reader sees the whole old
    file or the whole new one. Without ``replace`` it is published with a hard link, which fails
    when the file exists: two processes starting together agree on whichever wrote first.
    """
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        mode = 0o600
        with contextlib.suppress(FileNotFoundError):
            # An owner who made the file stricter still (read-only, say) keeps it that way.
            mode &= stat.S_IMODE(path.stat().st_mode) | 0o400
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        with os.fdopen(descriptor, "w", encoding="utf-8") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        if replace:
            os.replace(temporary, path)
            return True
        try:
            os.link(temporary, path)
        except FileExistsError:
            return False
        except OSError:
            # Some filesystems have no hard links; there the race is merely unlikely.
            if path.exists():
                return False
            os.replace(temporary, path)
        return True
    except OSError as error:
        raise _unusable(path, error) from error
    finally:
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
