"""The cluster key and the node id, on real files in a temporary exo-tui home."""

from __future__ import annotations

import json
import re
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from exo_tui.cluster.errors import IdentityError
from exo_tui.cluster.identity import (
    KEY_ENV,
    ClusterKey,
    key_path,
    load_cluster_key,
    load_node_identity,
    machine_fingerprint,
    node_path,
    replace_cluster_key,
)

GOOD_KEY = "a-good-cluster-key-BfPwTiOgwxlEKQ3eU9ZfywmF6plFGDmjrwXsp_VFcB4"
OTHER_KEY = "another-cluster-key-bgBSizb5sQf5fl3vkUDttxKB3XSjTUkSk-LtXYj_w48"
NODE_ID = re.compile(r"n-[0-9a-f]{12}")


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def write_key_file(text: str, mode: int = 0o600) -> Path:
    path = key_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)
    return path


# The cluster key


def test_a_key_is_made_on_first_use_and_kept(exo_home: Path) -> None:
    assert not exo_home.exists()
    first = load_cluster_key()
    assert key_path() == exo_home / "config" / "cluster.key"
    assert key_path().read_text() == first.text + "\n"
    assert mode_of(key_path()) == 0o600
    assert len(first.text) >= 32
    assert load_cluster_key() == first


def test_a_key_file_readable_by_others_is_tightened(exo_home: Path) -> None:
    path = write_key_file(GOOD_KEY + "\n", mode=0o644)
    assert load_cluster_key().text == GOOD_KEY
    assert mode_of(path) == 0o600


def test_flag_beats_environment_beats_file(exo_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_key_file(GOOD_KEY)
    monkeypatch.setenv(KEY_ENV, OTHER_KEY)
    flag = "the-key-from-the-flag-Yq3vN0sXbH2kLw9rT5mE1cJ8uAzP4dGfK7iOeR6t"
    assert load_cluster_key(flag).text == flag
    assert load_cluster_key().text == OTHER_KEY
    monkeypatch.setenv(KEY_ENV, "  ")  # blank counts as unset
    assert load_cluster_key().text == GOOD_KEY


def test_a_key_given_by_flag_or_environment_is_not_written(
    exo_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert load_cluster_key(f"  {GOOD_KEY}\n").text == GOOD_KEY  # pasted with a newline
    monkeypatch.setenv(KEY_ENV, OTHER_KEY)
    assert load_cluster_key().text == OTHER_KEY
    assert not key_path().exists()


@pytest.mark.parametrize(
    ("text", "cause"),
    [
        ("", "is empty"),
        ("short-key", "has only 9 characters; a key needs at least 16"),
        ("two words in one key", "whitespace inside"),
        ("clé-de-la-grappe-0123", "non-ASCII"),
        ("control\x07character-key", "control characters"),
    ],
)
def test_bad_keys_name_the_cause_and_the_fix(
    exo_home: Path, monkeypatch: pytest.MonkeyPatch, text: str, cause: str
) -> None:
    with pytest.raises(IdentityError) as from_flag:
        load_cluster_key(text)
    assert "--key" in from_flag.value.cause and cause in from_flag.value.cause
    assert "exo-tui key" in from_flag.value.fix
    if text:  # an empty variable counts as unset
        monkeypatch.setenv(KEY_ENV, text)
        with pytest.raises(IdentityError, match=KEY_ENV):
            load_cluster_key()
    assert not key_path().exists()


# Long enough and printable, yet found in far fewer than 2**128 guesses: words, repeats, walks,
# dates, l33t, counting, and the tests' own old keys.
GUESSABLE_KEYS = [
    "test-cluster-key-0123456789",
    "a-good-cluster-key-0123456789",
    "correct-horse-battery-staple",
    "correct-horse-battery-staple-correct-horse-battery-staple-again-and-again",
    "password1234567890",
    "P@ssw0rdP@ssw0rd!!",
    "Tr0ub4dor&3Tr0ub4dor&3xyzzyplugh",
    "a" * 32,
    "ab" * 40,  # longer than the estimator reads: its first 72 characters count
    "qwertyuiopasdfghjkl",
    "2024-01-01-my-cluster",
    "0123456789abcdef0123",
    "exo-tui-cluster-key",
    "mycluster-mycluster-mycluster",
]


@pytest.mark.parametrize("text", GUESSABLE_KEYS)
def test_a_guessable_key_is_refused_from_every_source(
    exo_home: Path, monkeypatch: pytest.MonkeyPatch, text: str
) -> None:
    with pytest.raises(IdentityError) as from_flag:
        load_cluster_key(text)
    cause = from_flag.value.cause
    assert "--key" in cause and "too easy to guess" in cause and "2^128" in cause
    assert "exo-tui key --new" in from_flag.value.fix
    monkeypatch.setenv(KEY_ENV, text)
    with pytest.raises(IdentityError, match=KEY_ENV):
        load_cluster_key()
    monkeypatch.delenv(KEY_ENV)
    path = write_key_file(text + "\n")
    with pytest.raises(IdentityError) as from_file:
        load_cluster_key()
    assert str(path) in from_file.value.cause and "too easy to guess" in from_file.value.cause
    assert "exo-tui key --new" in from_file.value.fix
    assert path.read_text() == text + "\n"  # left for the user to replace


def test_every_fresh_key_is_accepted(exo_home: Path) -> None:
    for _ in range(200):
        fresh = replace_cluster_key()
        assert load_cluster_key() == fresh
        assert load_cluster_key(fresh.text) == fresh


def test_a_bad_key_file_is_named_with_the_way_out(exo_home: Path) -> None:
    path = write_key_file("too short\n")
    with pytest.raises(IdentityError) as error:
        load_cluster_key()
    assert str(path) in error.value.cause
    assert "exo-tui key --new" in error.value.fix
    assert path.read_text() == "too short\n"  # left for the user to look at


def test_a_folder_where_the_key_file_belongs_is_an_error(exo_home: Path) -> None:
    key_path().mkdir(parents=True)
    with pytest.raises(IdentityError, match="not a file"):
        load_cluster_key()


def test_replacing_the_key_writes_a_new_one(exo_home: Path) -> None:
    old = load_cluster_key()
    new = replace_cluster_key()
    assert new != old
    assert load_cluster_key() == new
    assert mode_of(key_path()) == 0o600
    assert [p.name for p in key_path().parent.iterdir()] == ["cluster.key"]  # no temporary left


def test_replacing_keeps_a_stricter_mode(exo_home: Path) -> None:
    write_key_file(GOOD_KEY, mode=0o400)
    replace_cluster_key()
    assert mode_of(key_path()) == 0o400


def test_the_fingerprint_names_a_key_without_revealing_it() -> None:
    key = ClusterKey(text=GOOD_KEY)
    assert key.secret == GOOD_KEY.encode()
    assert re.fullmatch(r"[0-9a-f]{16}", key.fingerprint)
    assert ClusterKey(text=GOOD_KEY).fingerprint == key.fingerprint
    assert ClusterKey(text=OTHER_KEY).fingerprint != key.fingerprint
    assert GOOD_KEY not in key.fingerprint and key.fingerprint not in GOOD_KEY
    assert GOOD_KEY not in repr(key) and GOOD_KEY not in str(key)


# The node id


def test_the_node_id_is_made_once_and_kept(exo_home: Path) -> None:
    first = load_node_identity()
    assert NODE_ID.fullmatch(first.node_id)
    assert first.name == socket.gethostname()
    assert node_path() == exo_home / "data" / "node.json"
    assert load_node_identity() == first
    assert load_node_identity(name="studio").node_id == first.node_id
    assert load_node_identity(name="studio").name == "studio"


def test_a_node_file_from_another_machine_gets_a_new_id(exo_home: Path) -> None:
    node_path().parent.mkdir(parents=True)
    copied = {"node_id": "n-0123456789ab", "machine": "0" * 16}
    assert copied["machine"] != machine_fingerprint()
    node_path().write_text(json.dumps(copied))

    mine = load_node_identity()
    assert mine.node_id != copied["node_id"]
    assert NODE_ID.fullmatch(mine.node_id)
    stored = json.loads(node_path().read_text())
    assert stored == {"node_id": mine.node_id, "machine": machine_fingerprint()}
    assert load_node_identity() == mine


def test_each_home_has_its_own_node_id(exo_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = load_node_identity()
    monkeypatch.setenv("EXO_TUI_HOME", str(exo_home.parent / "second-home"))
    second = load_node_identity()
    assert second.node_id != first.node_id
    monkeypatch.setenv("EXO_TUI_HOME", str(exo_home))
    assert load_node_identity() == first


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"not json at all",
        b'{"node_id": 5}',
        b'{"node_id": "../../etc/passwd", "machine": "x"}',
        b"\xff\xfe\x00",
    ],
    ids=["empty", "not-json", "wrong-type", "bad-id", "binary"],
)
def test_a_corrupt_node_file_is_replaced(exo_home: Path, content: bytes) -> None:
    node_path().parent.mkdir(parents=True)
    node_path().write_bytes(content)
    mine = load_node_identity()
    assert NODE_ID.fullmatch(mine.node_id)
    assert json.loads(node_path().read_text())["node_id"] == mine.node_id
    assert load_node_identity() == mine


def test_a_node_file_from_a_newer_version_keeps_its_id(exo_home: Path) -> None:
    node_path().parent.mkdir(parents=True)
    stored = {"node_id": "n-0123456789ab", "machine": machine_fingerprint(), "later": 1}
    node_path().write_text(json.dumps(stored))
    assert load_node_identity().node_id == "n-0123456789ab"


def test_the_machine_fingerprint_is_the_same_in_every_process() -> None:
    # A fingerprint that changed per process would give this machine a new id at every start.
    code = "from exo_tui.cluster.identity import machine_fingerprint; print(machine_fingerprint())"
    other = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert other.stdout.strip() == machine_fingerprint()
    assert re.fullmatch(r"[0-9a-f]{16}", machine_fingerprint())
