"""Tests mirror the packages: tests/engine, tests/cli, ..."""

# The engine first, so MLX binds to the fast system BLAS in the test process too.
import engine  # noqa: F401
