"""`client.models`: the base models the server fine-tunes and the models your jobs trained
(`ft:<base>:<name or tenant>:<job id>`, and `...:ckpt-<step>` for a kept checkpoint)."""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import quote

from eft.types.openai import Model, ModelList

if TYPE_CHECKING:
    from eft.client import AsyncClient, Client


def _path(model: str) -> str:
    return "/v1/models/" + quote(model, safe="/:")


class Models:
    """`client.models`: list and retrieve models (GET /v1/models)."""

    def __init__(self, client: Client):
        self._client = client

    def list(self) -> ModelList:
        """Base models by name, then your fine-tuned models, newest first."""
        return self._client._request("GET", "/v1/models", cast=ModelList)

    def retrieve(self, model: str) -> Model:
        """One model by name or `ft:` id; raises NotFoundError (`model_not_found`) otherwise."""
        return self._client._request("GET", _path(model), cast=Model)


class AsyncModels:
    """`async_client.models`: the coroutine twin of `Models`."""

    def __init__(self, client: AsyncClient):
        self._client = client

    async def list(self) -> ModelList:
        return await self._client._request("GET", "/v1/models", cast=ModelList)

    async def retrieve(self, model: str) -> Model:
        return await self._client._request("GET", _path(model), cast=Model)
