"""Build llama.cpp (the anchor of bench/cpu_kernels.py) from the llama-cpp-python source
distribution on the package index, once, into a cache folder; `python bench/llama_cpp.py` builds it.

Only `llama-bench` and `llama-quantize` are built, for this CPU (GGML_NATIVE): about 8 minutes on
2 cores the first time, nothing after.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

VERSION = "0.3.36"
TOOLS = ("llama-bench", "llama-quantize")


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "exo-tui-bench" / f"llama.cpp-{VERSION}"


def tool(name: str) -> Path:
    return cache_dir() / "build" / "bin" / name


def ensure_built(log: bool = True) -> Path:
    """The folder of the built tools; builds them first if any is missing."""
    if all(tool(name).exists() for name in TOOLS):
        return tool(TOOLS[0]).parent
    root = cache_dir()
    source = root / "src"
    if not (source / "CMakeLists.txt").exists():
        with tempfile.TemporaryDirectory() as download:
            subprocess.run(
                [
                    *(sys.executable, "-m", "pip", "download", "--no-deps"),
                    *("--no-binary", ":all:", "--no-build-isolation"),
                    *(f"llama-cpp-python=={VERSION}", "-d", download),
                ],
                check=True,
            )
            archive = next(Path(download).glob("llama_cpp_python-*.tar.gz"))
            with tarfile.open(archive) as tar:
                tar.extractall(download, filter="data")
            vendored = next(Path(download).glob("llama_cpp_python-*")) / "vendor" / "llama.cpp"
            shutil.rmtree(source, ignore_errors=True)
            source.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(vendored), source)
    build = root / "build"
    flags = [
        "-DCMAKE_BUILD_TYPE=Release",
        "-DGGML_NATIVE=ON",
        "-DLLAMA_CURL=OFF",
        "-DLLAMA_BUILD_TESTS=OFF",
        "-DLLAMA_BUILD_EXAMPLES=OFF",
        "-DBUILD_SHARED_LIBS=OFF",
    ]
    if log:
        print(f"building llama.cpp {VERSION} in {build} (minutes, once)", flush=True)
    subprocess.run(["cmake", "-S", str(source), "-B", str(build), *flags], check=True)
    jobs = str(os.cpu_count() or 2)
    subprocess.run(["cmake", "--build", str(build), "-j", jobs, "--target", *TOOLS], check=True)
    return tool(TOOLS[0]).parent


if __name__ == "__main__":
    print(ensure_built())
