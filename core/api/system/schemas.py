"""Wire schemas of the service routes: ``/v1/models``."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict


class ModelCard(BaseModel):
    model_config = ConfigDict(extra="allow", protected_namespaces=())
    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "tessera"
    model_sha: str | None = None  # the Hub commit served; null for a local folder


class Frontends(BaseModel):
    count: int  # front-end processes serving this port (1: one process)
    reason: str  # why that many (the setting `frontends`, or what `auto` found)


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
    frontends: Frontends | None = None
