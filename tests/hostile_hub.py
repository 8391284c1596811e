"""A stand-in hub that lies: it names paths where hashes and files belong, to write elsewhere.

`HostileHub` serves a model folder as `HubServer` does, then alters what it says about it: a
field of a file's entry in the model info (`lie_about(file, "lfs.sha256", "../../x")`), the
commit (`lie_about_commit`), the headers of its answers about a file (`lie_in_headers`), the
whole model info (`answer_info`), or the name it lists a file under (`rename`, which serves the
file's bytes under the new name too). Each lie is what a broken or compromised HF_ENDPOINT
mirror could send.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path

from tests.hub_server import HubRepo, HubServer

_MISSING = object()


class HostileHub(HubServer):
    def __init__(self) -> None:
        super().__init__()
        self._entry_lies: dict[str, dict[str, object]] = {}
        self._commit_lie: object = _MISSING
        self._header_lies: dict[str, dict[str, str]] = {}
        self._info: Callable[[dict[str, object]], object] | None = None

    def lie_about(self, file: str, field: str, value: object) -> None:
        """Say `value` for `field` of `file`'s entry (`"lfs.sha256"` reaches into its lfs part)."""
        self._entry_lies.setdefault(file, {})[field] = value

    def lie_about_commit(self, value: object) -> None:
        self._commit_lie = value

    def lie_in_headers(self, file: str, **headers: str) -> None:
        """Send these headers (`X_Linked_Etag=` for X-Linked-Etag) in every answer about `file`."""
        lies = self._header_lies.setdefault(file, {})
        lies.update({key.replace("_", "-"): value for key, value in headers.items()})

    def answer_info(self, make: Callable[[dict[str, object]], object]) -> None:
        """Answer the model info with `make(honest_info)`, whatever JSON that is."""
        self._info = make

    def rename(self, repo_id: str, file: str, new_name: str) -> None:
        """List `file` as `new_name`, and serve its bytes under that name."""
        repo = self.repos[repo_id]
        repo.files[new_name] = repo.files.pop(file)
        if file in self._entry_lies:
            self._entry_lies[new_name] = self._entry_lies.pop(file)

    # -- the answers, altered

    def model_info(self, repo: HubRepo, info: dict[str, object]) -> dict[str, object]:
        siblings = info["siblings"]
        assert isinstance(siblings, list)
        for sibling in siblings:
            assert isinstance(sibling, dict)
            for field, value in self._entry_lies.get(str(sibling["rfilename"]), {}).items():
                target: dict[str, object] = sibling  # type: ignore[assignment]
                *parents, last = field.split(".")
                for part in parents:
                    target = target.setdefault(part, {})  # type: ignore[assignment]
                target[last] = value
        if self._commit_lie is not _MISSING:
            info["sha"] = self._commit_lie
        if self._info is not None:
            return self._info(info)  # type: ignore[return-value]
        return info

    def file_headers(self, repo: HubRepo, name: str, headers: dict[str, str]) -> dict[str, str]:
        return headers | self._header_lies.get(name, {})


def climb_to(target: Path, start: Path) -> str:
    """The relative path from folder `start` to `target`: `../../target` and the like."""
    return os.path.relpath(target, start)


def tree_outside(root: Path, *inside: Path) -> dict[str, str]:
    """Every file and link under `root` but not under the `inside` folders, with a digest of
    what it holds: compared before and after, it shows whatever was written outside them."""
    found: dict[str, str] = {}
    for folder, dirs, files in os.walk(root, followlinks=False):
        here = Path(folder)
        if any(here == i or i in here.parents for i in inside):
            dirs.clear()
            continue
        for name in files + [d for d in dirs if (here / d).is_symlink()]:
            path = here / name
            if path.is_symlink():
                found[str(path)] = "link to " + os.readlink(path)
            else:
                found[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found
