"""The base of the API's request models: frozen, and fields the spec has that we do not read
are let through (clients send many), where engine messages refuse them."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class WireRequest(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")
