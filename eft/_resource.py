"""The base of the client's resources (`client.jobs`, `client.files`, `client.models`,
`client.webhooks`): a resource is a group of endpoints, and it reaches the service only through
the methods here, the client's transport (a request with its retries, server-sent events resumed
after a dropped connection, a file streamed to disk with its retries, the wait between polls),
never through the client's own attributes."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import httpx

    from eft._base import ServerEvent
    from eft.client import AsyncClient, Client

T = TypeVar("T")


class SyncAPIResource:
    def __init__(self, client: Client):
        self._client = client

    def _request(self, method: str, path: str, *, cast: type[T], **kwargs: Any) -> T:
        """The answer to a request, validated as `cast`, after the client's retries."""
        return self._client._request(method, path, cast=cast, **kwargs)

    def _request_json(self, method: str, path: str, **kwargs: Any) -> Any:
        return self._client._request_json(method, path, **kwargs)

    def _request_bytes(self, method: str, path: str, **kwargs: Any) -> bytes:
        return self._client._request_bytes(method, path, **kwargs)

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return self._client._send(method, path, **kwargs)

    def _events(self, path: str, params: Mapping[str, Any]) -> Iterator[ServerEvent]:
        """The server-sent events of a GET, resumed from the last event id after a dropped
        connection."""
        return self._client._events(path, params)

    def _download(self, path: str, params: Mapping[str, Any], open_sink: Callable[[], Any]) -> Any:
        """A streamed GET of one file into a new `open_sink()` per try (`write`, `finish`,
        `abort`); returns what the sink's `finish` returns."""
        return self._client._download(path, params, open_sink)

    def _sleep(self, seconds: float) -> None:
        self._client._sleep(seconds)


class AsyncAPIResource:
    def __init__(self, client: AsyncClient):
        self._client = client

    async def _request(self, method: str, path: str, *, cast: type[T], **kwargs: Any) -> T:
        return await self._client._request(method, path, cast=cast, **kwargs)

    async def _request_json(self, method: str, path: str, **kwargs: Any) -> Any:
        return await self._client._request_json(method, path, **kwargs)

    async def _request_bytes(self, method: str, path: str, **kwargs: Any) -> bytes:
        return await self._client._request_bytes(method, path, **kwargs)

    async def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return await self._client._send(method, path, **kwargs)

    def _events(self, path: str, params: Mapping[str, Any]) -> AsyncIterator[ServerEvent]:
        return self._client._events(path, params)

    async def _download(self, path: str, params: Mapping[str, Any], open_sink: Callable[[], Any]) -> Any:
        return await self._client._download(path, params, open_sink)

    async def _sleep(self, seconds: float) -> None:
        await self._client._sleep(seconds)
