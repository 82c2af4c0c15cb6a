"""Domain records as plain data (what JSON and YAML hold) and back, driven by the dataclasses'
own fields, types and defaults.

`encode` turns dataclasses into mappings, tuples into lists, enums into their values, and bytes
into text when they are UTF-8, `{base64: ...}` otherwise. `decode` is its inverse for one record
type: a field left out takes the dataclass default, and a value of the wrong shape raises
InvalidArgument naming the field as `where.<path>`. Decoding checks shapes only; what the values
mean is for `EpisodeSpec.validate`, which runs once, at the API boundary.

A field's metadata may carry `shape`, the words an error uses for what the field must be.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import enum
import math
import types
import typing
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

from orchestrator.domain.errors import InvalidArgument

T = TypeVar("T")


def encode(value: Any) -> Any:
    """Plain, JSON- and YAML-safe data for a record."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            return {"base64": base64.b64encode(value).decode()}
    if isinstance(value, list | tuple):
        return [encode(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): encode(v) for k, v in value.items()}
    return value


def decode(cls: type[T], data: Any, where: str, *, base: Path | None = None) -> T:
    """Build a `cls` from plain data. `base` lets bytes come `{from_file: path}` relative to it,
    which only a user's own spec file may do."""
    return typing.cast(T, _Decoder(base).value(cls, data, where, ""))


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _kind(value: Any) -> str:
    """How an error shows the value it got: scalars as written, containers by kind."""
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    text = "null" if value is None else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class _Decoder:
    def __init__(self, base: Path | None) -> None:
        self.base = base

    def value(self, hint: Any, data: Any, where: str, shape: str) -> Any:
        origin, args = typing.get_origin(hint), typing.get_args(hint)
        if origin in (typing.Union, types.UnionType):
            if data is None and type(None) in args:
                return None
            (inner,) = [a for a in args if a is not type(None)]
            return self.value(inner, data, where, shape)
        if dataclasses.is_dataclass(hint):
            return self.record(typing.cast(type, hint), data, where)
        if origin is tuple or origin is list:
            if isinstance(data, str | bytes) or not isinstance(data, list | tuple):
                raise InvalidArgument(where, f"must be {shape or 'a list'}, not {_kind(data)}")
            items = [self.value(args[0], item, f"{where}[{i}]", "") for i, item in enumerate(data)]
            return tuple(items) if origin is tuple else items
        if origin is dict:
            if data is None:
                return {}
            if not isinstance(data, Mapping):
                raise InvalidArgument(where, f"must be {shape or 'a mapping'}, not {_kind(data)}")
            return {str(k): self.value(args[1], v, f"{where}.{k}", "") for k, v in data.items()}
        if hint is Any:
            return data
        if isinstance(hint, type) and issubclass(hint, enum.Enum):
            try:
                return hint(data)
            except ValueError:
                choices = ", ".join(str(m.value) for m in hint)
                raise InvalidArgument(where, f"{data!r} is not one of {choices}") from None
        return self.scalar(hint, data, where, shape)

    def scalar(self, hint: Any, data: Any, where: str, shape: str) -> Any:
        if hint is bytes:
            return self.content(data, where)
        if hint is bool:
            if isinstance(data, bool):
                return data
        elif hint is int or hint is float:
            if isinstance(data, int | float) and not isinstance(data, bool):
                if not math.isfinite(data):
                    raise InvalidArgument(where, f"must be a finite number, not {data!r}")
                if hint is int and data != int(data):
                    raise InvalidArgument(where, f"must be a whole number, not {_kind(data)}")
                return hint(data)
            shape = shape or "a number"
        elif hint is str:
            if isinstance(data, str):
                return data
            shape = shape or "a string"
        else:
            raise TypeError(f"{where}: no plain form for {hint!r}")
        raise InvalidArgument(where, f"must be {shape or hint.__name__}, not {_kind(data)}")

    def content(self, data: Any, where: str) -> bytes:
        """File contents: text, {base64: ...}, or in a user's spec file {from_file: path}."""
        if isinstance(data, str):
            return data.encode()
        if isinstance(data, bytes):
            return data
        if isinstance(data, Mapping) and set(data) == {"base64"}:
            try:
                return base64.b64decode(data["base64"], validate=True)
            except (binascii.Error, TypeError, ValueError) as exc:
                raise InvalidArgument(where, f"is not valid base64: {exc}") from None
        if isinstance(data, Mapping) and set(data) == {"from_file"} and self.base is not None:
            local = self.base / str(data["from_file"])
            try:
                return local.read_bytes()
            except OSError as exc:
                raise InvalidArgument(where, f"cannot read {local}: {exc.strerror}") from None
        forms = "text, {base64: ...} or {from_file: path}" if self.base else "text or {base64: ...}"
        raise InvalidArgument(where, f"must be {forms}")

    def record(self, cls: type, data: Any, where: str) -> Any:
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            raise InvalidArgument(where, f"must be a mapping, not {_kind(data)}")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(map(str, data)) - set(fields))
        if unknown:
            raise InvalidArgument(
                f"{where}.{unknown[0]}", f"is not a field; expected one of {', '.join(fields)}"
            )
        hints = _hints(cls)
        kwargs = {}
        for name, f in fields.items():
            path = f"{where}.{name}"
            if name in data:
                kwargs[name] = self.value(hints[name], data[name], path, f.metadata.get("shape", ""))
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                shape = f.metadata.get("shape")
                raise InvalidArgument(path, f"is required; it must be {shape}" if shape else "is required")
        return cls(**kwargs)
