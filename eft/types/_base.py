"""Bases of every wire model: requests refuse unknown fields, responses keep them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel, ConfigDict


class _Request(BaseModel):
    # Non-finite numbers (Infinity, NaN) are refused everywhere: no setting means them.
    model_config = ConfigDict(extra="forbid", protected_namespaces=(), allow_inf_nan=False)


class _Response(BaseModel):
    # Responses tolerate fields a newer server adds, so an old client keeps working.
    model_config = ConfigDict(extra="allow", protected_namespaces=())


class ListResponse(_Response):
    """A list page: `for item in page`, `len(page)` and `page[0]` reach its `data`."""

    data: list[Any]

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override] - items, as openai's pages
        return iter(self.data)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> Any:
        return self.data[index]
