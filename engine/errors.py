"""Errors the user can act on: each names the cause and the fix."""

from __future__ import annotations


class EngineError(Exception):
    """An expected failure (bad path, file or request); the CLI prints it without a traceback."""

    def __init__(self, cause: str, fix: str) -> None:
        super().__init__(f"{cause}. {fix}")
        self.cause = cause
        self.fix = fix


class ModelNotFoundError(EngineError):
    pass


class ModelFormatError(EngineError):
    pass


class RequestError(EngineError):
    pass
