"""Reading a request's body: capped in size, JSON, then the route's pydantic model."""

from __future__ import annotations

import json
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from exo_tui.api.errors import ApiError, bad_request, from_validation

MAX_BODY_BYTES = 4 * 1024 * 1024
M = TypeVar("M", bound=BaseModel)


async def read_json(request: Request, cap: int = MAX_BODY_BYTES) -> Any:
    """The body as JSON; 413 past `cap` bytes (counted as they arrive, whatever the
    Content-Length says), 400 when it is not JSON."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > cap:
        raise _too_large(int(declared), cap)
    body = bytearray()
    async for part in request.stream():
        body.extend(part)
        if len(body) > cap:
            raise _too_large(len(body), cap)
    if not body.strip():
        raise bad_request("The request has no body. Send a JSON object")
    try:
        return json.loads(body)
    except UnicodeDecodeError:
        raise bad_request("The body is not UTF-8 text. Send JSON encoded as UTF-8") from None
    except json.JSONDecodeError as error:
        raise bad_request(
            f"The body is not valid JSON: {error.msg} at line {error.lineno} column "
            f"{error.colno}. Send one JSON object"
        ) from None


async def read_model(request: Request, model: type[M], what: str) -> M:
    data = await read_json(request)
    if not isinstance(data, dict):
        raise bad_request(f"The {what} must be a JSON object, not {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as error:
        raise from_validation(error, what) from None


def _too_large(size: int, cap: int) -> ApiError:
    return ApiError(
        413,
        f"The request body is {size} bytes or more, over this server's limit of {cap} bytes. "
        "Send a shorter conversation",
    )
