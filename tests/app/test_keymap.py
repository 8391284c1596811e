"""keys.toml: every binding id is known, keys are checked, and a key another action holds is
refused, each problem with the file and its line."""

from __future__ import annotations

from pathlib import Path

import pytest

from exo_tui.app.keymap import KeymapError, is_key, load_keymap


def keymap_file(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "keys.toml"
    path.write_text("\n".join(["# my keys", "[keys]", *lines]) + "\n")
    return path


def test_the_readme_ids_of_the_prompt_and_the_dialogs_are_known(tmp_path: Path) -> None:
    path = keymap_file(tmp_path, '"prompt.send" = "f11"', '"download.confirm" = "y"')
    assert load_keymap(path) == {"prompt.send": "f11", "download.confirm": "y"}


def test_a_key_that_is_no_key_is_refused_with_its_line(tmp_path: Path) -> None:
    path = keymap_file(tmp_path, '"app.help" = "f1"', '"app.launch" = "notakey+zz"')
    with pytest.raises(KeymapError, match=rf"{path}:4: 'notakey\+zz' is not a key"):
        load_keymap(path)


def test_an_unknown_id_is_refused_with_its_line(tmp_path: Path) -> None:
    path = keymap_file(tmp_path, '"app.nope" = "f5"')
    with pytest.raises(KeymapError, match=rf"{path}:3: unknown binding id 'app.nope'"):
        load_keymap(path)


def test_a_key_another_action_holds_is_not_stolen(tmp_path: Path) -> None:
    path = keymap_file(tmp_path, '"app.launch" = "ctrl+o"')
    with pytest.raises(KeymapError) as raised:
        load_keymap(path)
    message = str(raised.value)
    assert f"{path}:3: 'ctrl+o' for 'app.launch' is already 'app.pick_model'" in message


def test_a_key_the_prompt_holds_is_refused_for_an_app_action(tmp_path: Path) -> None:
    path = keymap_file(tmp_path, '"app.launch" = "up"')
    with pytest.raises(KeymapError, match="already 'prompt.history_previous'"):
        load_keymap(path)


def test_two_actions_may_swap_keys(tmp_path: Path) -> None:
    path = keymap_file(tmp_path, '"app.launch" = "ctrl+o"', '"app.pick_model" = "ctrl+l"')
    assert load_keymap(path) == {"app.launch": "ctrl+o", "app.pick_model": "ctrl+l"}


def test_the_same_key_on_two_dialogs_is_no_conflict(tmp_path: Path) -> None:
    path = keymap_file(tmp_path, '"picker.cancel" = "q"', '"nodes.cancel" = "q"')
    assert load_keymap(path) == {"picker.cancel": "q", "nodes.cancel": "q"}


@pytest.mark.parametrize("key", ["f5", "ctrl+l", "escape", "a", "question_mark", "ctrl+shift+f12"])
def test_keys_textual_names(key: str) -> None:
    assert is_key(key)


@pytest.mark.parametrize("key", ["notakey", "notakey+zz", "ctrl+", "hyperx+a", "f99", ""])
def test_no_keys(key: str) -> None:
    assert not is_key(key)
