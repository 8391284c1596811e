"""Finding models: the folders of the models dirs, the Hugging Face cache and the bundled demo,
listed as cards, and one model resolved by path or name."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from engine.errors import EngineError, ModelNotFoundError
from engine.models import locations
from engine.models.cards import read_card
from engine.models.locations import DEMO_SPEC, default_models_dir, hf_cache_dir
from engine.types import ModelCard, ModelSource


@dataclass(frozen=True)
class SkippedModel:
    """A folder that looked like a model but could not be read; `error` says why and what to do."""

    path: Path
    source: ModelSource
    error: EngineError


@dataclass(frozen=True)
class _Candidate:
    name: str
    path: Path
    source: ModelSource


def _is_visible_dir(path: Path) -> bool:
    return not path.name.startswith(".") and path.is_dir()


def _sorted_dirs(path: Path) -> list[Path]:
    try:
        return sorted((p for p in path.iterdir() if _is_visible_dir(p)), key=lambda p: p.name)
    except OSError:
        return []


def _models_dir_candidates(models_dir: Path) -> Iterator[_Candidate]:
    """`<dir>/<name>/config.json` and `<dir>/<org>/<name>/config.json`."""
    for sub in _sorted_dirs(models_dir):
        if (sub / "config.json").exists():
            yield _Candidate(sub.name, sub, "models_dir")
            continue
        for nested in _sorted_dirs(sub):
            if (nested / "config.json").exists():
                yield _Candidate(f"{sub.name}/{nested.name}", nested, "models_dir")


def _hf_cache_candidates() -> Iterator[_Candidate]:
    """The newest snapshot of each model repo in the Hugging Face cache (broken ones skipped)."""
    from huggingface_hub import CacheNotFound, scan_cache_dir

    try:
        info = scan_cache_dir(hf_cache_dir())
    except (CacheNotFound, ValueError, OSError):
        return
    for repo in sorted(info.repos, key=lambda r: r.repo_id):
        if repo.repo_type != "model" or not repo.revisions:
            continue
        revisions = sorted(repo.revisions, key=lambda r: r.last_modified, reverse=True)
        main = [r for r in revisions if "main" in r.refs]
        snapshot = (main or revisions)[0].snapshot_path
        if (snapshot / "config.json").exists():
            yield _Candidate(repo.repo_id, snapshot, "hf_cache")


def _candidates(
    models_dirs: Sequence[Path] | None, *, include_hf_cache: bool, include_bundled: bool
) -> list[_Candidate]:
    found: list[_Candidate] = []
    if include_bundled:
        demo = locations.bundled_demo_dir()
        if (demo / "config.json").exists():
            found.append(_Candidate(DEMO_SPEC, demo, "bundled"))
    dirs = [default_models_dir()] if models_dirs is None else list(models_dirs)
    for models_dir in dirs:
        found.extend(_models_dir_candidates(Path(models_dir).expanduser()))
    if include_hf_cache:
        found.extend(_hf_cache_candidates())
    seen: set[Path] = set()
    unique: list[_Candidate] = []
    for c in found:
        key = c.path.resolve()
        if key not in seen:
            seen.add(key)
            unique.append(c)
    return unique


def find_models_with_errors(
    models_dirs: Sequence[Path] | None = None,
    *,
    include_hf_cache: bool = True,
    include_bundled: bool = True,
) -> tuple[list[ModelCard], list[SkippedModel]]:
    """Every readable model, plus the folders that hold a config.json but failed to read.

    Order: the bundled demo, each models dir (default: `default_models_dir()`), then the
    Hugging Face cache.
    """
    cards: list[ModelCard] = []
    skipped: list[SkippedModel] = []
    for c in _candidates(
        models_dirs, include_hf_cache=include_hf_cache, include_bundled=include_bundled
    ):
        try:
            cards.append(read_card(c.path, c.source, name=c.name))
        except EngineError as e:
            skipped.append(SkippedModel(c.path, c.source, e))
    return cards, skipped


def find_models(
    models_dirs: Sequence[Path] | None = None,
    *,
    include_hf_cache: bool = True,
    include_bundled: bool = True,
) -> list[ModelCard]:
    """Every readable model; folders that fail to read are left out (find_models_with_errors)."""
    cards, _ = find_models_with_errors(
        models_dirs, include_hf_cache=include_hf_cache, include_bundled=include_bundled
    )
    return cards


def resolve_model(spec: str, models_dirs: Sequence[Path] | None = None) -> ModelCard:
    """A model by path, by name (`org/name` in the HF cache, a folder in a models dir) or "demo".

    An exact name wins, then a case-insensitive one, then the last part of a name (`name` for
    `org/name`) when it is unambiguous. A named model that fails to read raises its own error.
    """
    if spec == DEMO_SPEC:
        demo = locations.bundled_demo_dir()
        if not (demo / "config.json").exists():
            raise ModelNotFoundError(
                f"The bundled demo model is missing from {demo}",
                "Reinstall exo-tui, or pass another model",
            )
        return read_card(demo, "bundled", name=DEMO_SPEC)

    as_path = Path(spec).expanduser()
    if as_path.exists():
        return read_card(as_path, "path")

    candidates = _candidates(models_dirs, include_hf_cache=True, include_bundled=False)
    # Exact name, then any case, then the last part of `org/name` (exact, then any case).
    tiers: list[tuple[Callable[[str], str], str]] = [
        (lambda n: n, spec),
        (str.lower, spec.lower()),
        (lambda n: n.rsplit("/", 1)[-1], spec),
        (lambda n: n.rsplit("/", 1)[-1].lower(), spec.lower()),
    ]
    exact: list[_Candidate] = []
    for key, wanted in tiers:
        exact = [c for c in candidates if key(c.name) == wanted]
        if exact:
            break
    if len(exact) > 1 and len({c.name for c in exact}) > 1:
        names = ", ".join(sorted({c.name for c in exact}))
        raise ModelNotFoundError(
            f"'{spec}' matches several models: {names}",
            "Use the full name, or pass the model folder's path",
        )
    if exact:
        c = exact[0]
        return read_card(c.path, c.source, name=c.name)

    dirs = [default_models_dir()] if models_dirs is None else [Path(d) for d in models_dirs]
    searched = ", ".join(str(d) for d in dirs) or "no models dirs"
    raise ModelNotFoundError(
        f"No model named '{spec}' (no such path; searched {searched} and the "
        f"Hugging Face cache {hf_cache_dir()})",
        "Run `exo-tui models` to list the models found, or pass the path of a model folder",
    )
