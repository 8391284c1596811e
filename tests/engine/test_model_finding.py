"""Where models live, finding them in the models dirs, the Hugging Face cache and the bundled
demo, and resolving one by path or name (engine.models.locations, .finding)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from engine.errors import ModelFormatError, ModelNotFoundError
from engine.models import locations
from engine.models.finding import find_models, find_models_with_errors, resolve_model
from engine.models.locations import bundled_demo_dir, default_models_dir
from tests.engine.model_folders import write_model

# Never the real Hugging Face cache: an empty folder per test.
pytestmark = pytest.mark.usefixtures("empty_hf_cache")


# ------------------------------------------------------------------------------ locations


def test_locations(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EXO_TUI_HOME", raising=False)
    assert default_models_dir().parts[-2:] == ("exo-tui", "models")
    engine_dir = Path(locations.__file__).resolve().parent.parent
    assert bundled_demo_dir() == engine_dir / "demo" / "model"
    assert (bundled_demo_dir() / "config.json").is_file()


def test_exo_tui_home_holds_the_default_models_dir(exo_home: Path) -> None:
    # The same folder as exo_tui.store.paths puts the chats in, next to them.
    from exo_tui.store.paths import data_dir

    assert default_models_dir() == exo_home / "data" / "models" == data_dir() / "models"
    write_model(default_models_dir() / "alpha")
    assert [c.name for c in find_models(include_hf_cache=False, include_bundled=False)] == ["alpha"]


# ------------------------------------------------------------------------------ discovery


def make_models_dir(root: Path) -> Path:
    write_model(root / "alpha")
    write_model(root / "org" / "beta")
    write_model(root / "broken", files={})  # has config.json but no weights
    (root / "notes").mkdir()  # no config.json anywhere: ignored
    (root / "notes" / "readme.txt").write_text("hi")
    write_model(root / ".hidden")  # dot folders are ignored
    return root


def test_models_dir_discovery(tmp_path: Path) -> None:
    root = make_models_dir(tmp_path / "models")
    cards, skipped = find_models_with_errors([root], include_bundled=False)
    assert [(c.name, c.source) for c in cards] == [
        ("alpha", "models_dir"),
        ("org/beta", "models_dir"),
    ]
    assert cards[1].path == str((root / "org" / "beta").resolve())
    assert [s.path for s in skipped] == [root / "broken"]
    assert skipped[0].source == "models_dir"
    assert isinstance(skipped[0].error, ModelFormatError)
    assert str(root / "broken") in str(skipped[0].error)
    # find_models drops what failed to read; a missing models dir is no error.
    names = [c.name for c in find_models([root, tmp_path / "absent"], include_bundled=False)]
    assert names == ["alpha", "org/beta"]


def make_hf_repo(hub: Path, repo_id: str, sha: str, *, ref: str | None = "main") -> Path:
    """A repo in the real cache layout: blobs, snapshot symlinks into them, refs/<ref>."""
    repo = hub / ("models--" + repo_id.replace("/", "--"))
    staging = repo / "staging"
    write_model(staging)
    snapshot = repo / "snapshots" / sha
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir(exist_ok=True)
    for f in sorted(staging.iterdir()):
        blob = repo / "blobs" / f"{sha[:8]}-{f.name}"
        f.rename(blob)
        (snapshot / f.name).symlink_to(os.path.relpath(blob, snapshot))
    staging.rmdir()
    if ref:
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / ref).write_text(sha)
    return snapshot


def test_hf_cache_discovery(tmp_path: Path, empty_hf_cache: Path) -> None:
    hub = empty_hf_cache
    main = make_hf_repo(hub, "mlx-community/Tiny-4bit", "a" * 40)
    make_hf_repo(hub, "mlx-community/Tiny-4bit", "b" * 40, ref="old")  # another revision
    make_hf_repo(hub, "someone/other", "c" * 40)
    # Broken repos are skipped silently: a dangling blob link, no snapshots at all.
    broken = make_hf_repo(hub, "someone/broken", "d" * 40)
    (broken / "model.safetensors").resolve().unlink()
    (hub / "models--someone--nosnapshots").mkdir()
    # A dataset and a repo without config.json are not models.
    (hub / "datasets--someone--data" / "snapshots" / ("e" * 40)).mkdir(parents=True)
    tok_only = hub / "models--someone--tokenizer" / "snapshots" / ("f" * 40)
    tok_only.mkdir(parents=True)
    (tok_only / "tokenizer.json").write_text("{}")

    cards = find_models([], include_bundled=False)
    assert [(c.name, c.source) for c in cards] == [
        ("mlx-community/Tiny-4bit", "hf_cache"),
        ("someone/other", "hf_cache"),
    ]
    assert cards[0].path == str(main.resolve())
    assert cards[0].num_layers == 2
    assert cards[0].bytes_on_disk == (main / "model.safetensors").stat().st_size
    assert find_models([], include_bundled=False, include_hf_cache=False) == []


def test_hf_cache_missing_is_no_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "does-not-exist"))
    assert find_models([], include_bundled=False) == []


def test_hf_home_is_honoured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    make_hf_repo(tmp_path / "hf-home" / "hub", "org/name", "a" * 40)
    assert [c.name for c in find_models([], include_bundled=False)] == ["org/name"]


def test_bundled_demo_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    demo = write_model(tmp_path / "demo-model")
    monkeypatch.setattr(locations, "bundled_demo_dir", lambda: demo)
    root = make_models_dir(tmp_path / "models")
    cards = find_models([root, demo.parent])  # the demo folder is not listed twice
    assert [(c.name, c.source) for c in cards][:3] == [
        ("demo", "bundled"),
        ("alpha", "models_dir"),
        ("org/beta", "models_dir"),
    ]
    assert "demo-model" not in [c.name for c in cards]
    assert resolve_model("demo").source == "bundled"


def test_bundled_demo_absent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(locations, "bundled_demo_dir", lambda: tmp_path / "no-demo")
    assert find_models([], include_hf_cache=False) == []
    with pytest.raises(ModelNotFoundError) as e:
        resolve_model("demo", [])
    assert str(tmp_path / "no-demo") in e.value.cause


# ------------------------------------------------------------------------------ resolve


def test_resolve_by_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = write_model(tmp_path / "here")
    card = resolve_model(str(folder), [])
    assert (card.name, card.source, card.path) == ("here", "path", str(folder.resolve()))
    monkeypatch.chdir(tmp_path)
    assert resolve_model("here", []).source == "path"  # a relative path works too


def test_resolve_by_name(
    tmp_path: Path, empty_hf_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # no folder here named like the specs
    root = make_models_dir(tmp_path / "models")
    make_hf_repo(empty_hf_cache, "mlx-community/Tiny-4bit", "a" * 40)
    assert resolve_model("alpha", [root]).source == "models_dir"
    assert resolve_model("org/beta", [root]).name == "org/beta"
    assert resolve_model("beta", [root]).name == "org/beta"  # unambiguous last part
    hf = resolve_model("mlx-community/Tiny-4bit", [root])
    assert (hf.name, hf.source) == ("mlx-community/Tiny-4bit", "hf_cache")
    assert resolve_model("tiny-4bit", [root]).name == "mlx-community/Tiny-4bit"  # any case
    # A named model that is broken says why, rather than "not found".
    with pytest.raises(ModelFormatError, match="safetensors"):
        resolve_model("broken", [root])


def test_resolve_ambiguous_short_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    root = tmp_path / "models"
    write_model(root / "a" / "same")
    write_model(root / "b" / "same")
    with pytest.raises(ModelNotFoundError) as e:
        resolve_model("same", [root])
    assert "a/same" in e.value.cause and "b/same" in e.value.cause


def test_resolve_not_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    root = make_models_dir(tmp_path / "models")
    with pytest.raises(ModelNotFoundError) as e:
        resolve_model("no-such-model", [root])
    assert "'no-such-model'" in e.value.cause
    assert str(root) in e.value.cause
    assert "exo-tui models" in e.value.fix
