"""Settings: one object, read from `EFT_*` variables, declared in one section per concern.

Run: .venv/bin/python -m pytest tests/unit/service/test_settings.py -q
"""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from eft.service import settings as settings_module
from eft.service.settings import Settings

SECTIONS = [cls for cls in Settings.__mro__[1:]
            if isinstance(cls, type) and issubclass(cls, BaseModel) and cls.__module__ == settings_module.__name__]


def _declared(cls: type[BaseModel]) -> set[str]:
    return set(cls.__dict__.get("__annotations__", {}))


def test_every_setting_is_declared_by_exactly_one_section():
    assert len(SECTIONS) >= 8
    assert _declared(Settings) == set()  # no field outside a section
    owners: dict[str, list[str]] = {}
    for section in SECTIONS:
        assert section.__doc__ and len(section.__doc__) > 40, f"{section.__name__} says what it is for"
        for name in _declared(section):
            owners.setdefault(name, []).append(section.__name__)
    assert set(owners) == set(Settings.model_fields)
    assert {name: where for name, where in owners.items() if len(where) > 1} == {}


def _changed(value: object) -> object | None:
    """A value other than the default, still valid for its field (None: not a scalar)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value / 2 if value else 1.0
    return None


@pytest.mark.parametrize("section", SECTIONS, ids=lambda s: s.__name__)
def test_each_sections_settings_are_read_from_their_eft_variables(section, monkeypatch):
    """The variable of every scalar field is `EFT_<FIELD>`, whichever section declares it."""
    expected = {}
    for name in sorted(_declared(section)):
        value = _changed(Settings.model_fields[name].default)
        if value is not None:
            monkeypatch.setenv(f"EFT_{name.upper()}", str(value).lower() if isinstance(value, bool) else str(value))
            expected[name] = value
    assert expected, f"{section.__name__} has no scalar field to read"
    read = Settings()
    assert {name: getattr(read, name) for name in expected} == expected
