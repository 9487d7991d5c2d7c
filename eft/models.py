"""`client.models`: the base models the server fine-tunes and the models your jobs trained
(`ft:<base>:<name or tenant>:<job id>`, and `...:ckpt-<step>` for a kept checkpoint)."""

from __future__ import annotations

from urllib.parse import quote

from eft._resource import AsyncAPIResource, SyncAPIResource
from eft.types.openai import Model, ModelList


def _path(model: str) -> str:
    return "/v1/models/" + quote(model, safe="/:")


class Models(SyncAPIResource):
    """`client.models`: list and retrieve models (GET /v1/models)."""

    def list(self) -> ModelList:
        """Base models by name, then your fine-tuned models, newest first."""
        return self._request("GET", "/v1/models", cast=ModelList)

    def retrieve(self, model: str) -> Model:
        """One model by name or `ft:` id; raises NotFoundError (`model_not_found`) otherwise."""
        return self._request("GET", _path(model), cast=Model)


class AsyncModels(AsyncAPIResource):
    """`async_client.models`: the coroutine twin of `Models`."""

    async def list(self) -> ModelList:
        return await self._request("GET", "/v1/models", cast=ModelList)

    async def retrieve(self, model: str) -> Model:
        return await self._request("GET", _path(model), cast=Model)
