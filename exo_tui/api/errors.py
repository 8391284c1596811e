"""The API's errors: a status, a message naming the cause and the fix, and how each API shows it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from pydantic import ValidationError

from engine.errors import EngineError

ErrorKind = Literal[
    "invalid_request_error", "authentication_error", "not_found_error", "rate_limit_error",
    "server_error", "service_unavailable",
]  # fmt: skip


class ApiError(Exception):
    """An answer other than 200: raised anywhere in a route, shown in the API's error shape."""

    def __init__(
        self,
        status: int,
        message: str,
        kind: ErrorKind = "invalid_request_error",
        *,
        param: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.param = param
        self.headers = dict(headers or {})


def bad_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param=param)


def from_engine(error: EngineError) -> ApiError:
    """A request the engine refused (too long a prompt, a bad value): the client's to fix."""
    return bad_request(str(error))


def from_validation(error: ValidationError, what: str) -> ApiError:
    """Every field pydantic refused, by its path, in one message."""
    problems: list[str] = []
    for item in error.errors(include_url=False)[:8]:
        where = ".".join(str(part) for part in item["loc"]) or "the body"
        problems.append(f"{where}: {item['msg']}")
    first = error.errors(include_url=False)[0]["loc"] if error.error_count() else ()
    param = ".".join(str(part) for part in first) or None
    return bad_request(
        f"The {what} is not valid: {'; '.join(problems)}. Fix these fields and send it again",
        param,
    )
