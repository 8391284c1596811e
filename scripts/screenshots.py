"""Regenerate screenshots/: an SVG and a PNG of every main screen (`make screenshots`).

The scenes are the snapshot tests' own (tests/app/scenes.py): a real app on a tiny model built
here, with fixed node stats.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import engine  # noqa: E402,F401  (fast BLAS before MLX)
from tests.app.scenes import SCENES, SIZE, scene_app  # noqa: E402
from tests.tiny_models import build_tiny_model  # noqa: E402

OUT = ROOT / "screenshots"


async def shoot(name: str, models: Path) -> Path:
    app = scene_app(None if name == "empty" else models)
    async with app.run_test(size=SIZE) as pilot:
        await SCENES[name](app, pilot)
        svg = app.export_screenshot(title=f"exo-tui: {name}")
    path = OUT / f"{name}.svg"
    path.write_text(svg, encoding="utf-8")
    return path


def main() -> None:
    import cairosvg  # the dev extra has it; needs the system cairo library

    OUT.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        # A home of its own, as the snapshot tests have: the user's saved chats and settings
        # would show in the pictures.
        os.environ["EXO_TUI_HOME"] = str(Path(tmp) / "home")
        os.environ["HF_HUB_CACHE"] = str(Path(tmp) / "hf-cache")
        models = Path(tmp) / "models"
        build_tiny_model(models / "tiny-llama", "llama")
        for name in SCENES:
            svg = asyncio.run(shoot(name, models))
            cairosvg.svg2png(url=str(svg), write_to=str(svg.with_suffix(".png")), scale=1.0)
            print(f"{svg.relative_to(ROOT)} and .png")
    shutil.rmtree(ROOT / "screenshots" / "__pycache__", ignore_errors=True)


if __name__ == "__main__":
    main()
