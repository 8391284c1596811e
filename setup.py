"""Builds engine/kernels (the CPU matmul kernels, a C++ extension for MLX) with MLX's own
extension support. The build is optional: without a compiler or cmake the install still
succeeds, and the engine runs on MLX's kernels and says so. macOS computes on Metal, which keeps
MLX's kernels, so nothing is built there."""

from __future__ import annotations

import sys

from setuptools import setup

KERNELS = "engine.kernels._kernels"


def kernel_build() -> tuple[list[object], dict[str, type]]:
    if sys.platform == "darwin":
        return [], {}
    try:
        from mlx.extension import CMakeBuild, CMakeExtension
    except ImportError as error:
        print(f"exo-tui: not building the CPU kernels ({error})", file=sys.stderr)
        return [], {}

    class OptionalCMakeBuild(CMakeBuild):
        """A failed kernel build warns and leaves the engine on MLX's kernels."""

        def run(self) -> None:
            try:
                super().run()
            except Exception as error:  # noqa: BLE001 - any build failure must not fail install
                print(
                    f"exo-tui: WARNING: the CPU kernels were not built ({error}). exo-tui still "
                    "runs, on MLX's slower kernels; install a C++ compiler and cmake "
                    "(Debian: apt install g++ cmake) and run pip install -e . again",
                    file=sys.stderr,
                )

        def get_outputs(self) -> list[str]:
            from pathlib import Path

            return [path for path in super().get_outputs() if Path(path).exists()]

    return [CMakeExtension(KERNELS, sourcedir="engine/kernels")], {"build_ext": OptionalCMakeBuild}


ext_modules, cmdclass = kernel_build()
setup(ext_modules=ext_modules, cmdclass=cmdclass)
