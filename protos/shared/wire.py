"""Protobuf messages and records, converted by field name in one generic codec both sides use.

The orchestrator's public service, its typed client and its node-agent client convert through
`encode` and `decode`, and so does the node agent's service: no module copies a record field by
field. The rules:

* a record field and the message field of the same name carry the same value; fields only one
  side has are left alone, and keyword overrides supply computed values;
* a bool message field `has_<name>` says whether the optional record field (or override)
  `<name>` is set;
* an unset message field, or an unset proto3 `optional` scalar, means the record's default;
* an enum travels by member name: `EpisodeState.RUNNING` is `EPISODE_STATE_RUNNING`;
* a string message field for a record field that is not a string carries JSON.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import re
import types
import typing
from collections.abc import Mapping
from functools import cache
from typing import Any, TypeVar

from google.protobuf.descriptor import Descriptor, EnumDescriptor, FieldDescriptor
from google.protobuf.message import Message

T = TypeVar("T")
M = TypeVar("M", bound=Message)


@cache
def _prefix(enum_type: EnumDescriptor) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", enum_type.name).upper() + "_"


def enum_number(enum_type: EnumDescriptor, value: Any) -> int:
    """The wire number of a domain enum member (or its name); 0 if the wire enum lacks it."""
    name = value.name if isinstance(value, enum.Enum) else str(value)
    entry = enum_type.values_by_name.get(_prefix(enum_type) + name)
    return entry.number if entry is not None else 0


def enum_name(enum_type: EnumDescriptor, number: int) -> str:
    """The member name a wire number stands for; "" for UNSPECIFIED or an unknown number."""
    entry = enum_type.values_by_number.get(number)
    name = entry.name.removeprefix(_prefix(enum_type)) if entry is not None else ""
    return "" if name == "UNSPECIFIED" else name


def encode(record: Any, message: type[M], **overrides: Any) -> M:
    """A `message` holding the record's fields (and the overrides)."""
    msg = message()
    _fill(msg, record, overrides)
    return msg


def _fill(msg: Message, record: Any, overrides: Mapping[str, Any]) -> None:
    fields = msg.DESCRIPTOR.fields_by_name
    for name, fd in fields.items():
        if name in overrides:
            value = overrides[name]
        elif name.startswith("has_") and name[4:] in fields and name[4:] in overrides:
            value = overrides[name[4:]] is not None
        elif name.startswith("has_") and name[4:] in fields and hasattr(record, name[4:]):
            value = getattr(record, name[4:]) is not None
        elif hasattr(record, name):
            value = getattr(record, name)
        else:
            continue
        if value is not None:
            _set(msg, fd, value)


def _set(msg: Message, fd: FieldDescriptor, value: Any) -> None:
    name = fd.name
    if _is_map(fd):
        target = getattr(msg, name)
        item = fd.message_type.fields_by_name["value"]
        for key, v in value.items():
            if item.type == FieldDescriptor.TYPE_MESSAGE:
                _put(target[key], v)
            else:
                target[key] = v
    elif fd.is_repeated:
        target = getattr(msg, name)
        if fd.type == FieldDescriptor.TYPE_MESSAGE:
            for v in value:
                _put(target.add(), v)
        elif fd.type == FieldDescriptor.TYPE_ENUM:
            target.extend(enum_number(fd.enum_type, v) for v in value)
        else:
            target.extend(value)
    elif fd.type == FieldDescriptor.TYPE_MESSAGE:
        sub = getattr(msg, name)
        sub.SetInParent()
        _put(sub, value)
    elif fd.type == FieldDescriptor.TYPE_ENUM:
        setattr(msg, name, enum_number(fd.enum_type, value))
    elif fd.type == FieldDescriptor.TYPE_STRING and not isinstance(value, str):
        setattr(msg, name, json.dumps(value))
    else:
        setattr(msg, name, value)


def _put(target: Message, value: Any) -> None:
    if isinstance(value, Message):
        target.CopyFrom(value)
    else:
        _fill(target, value, {})


def _is_map(fd: FieldDescriptor) -> bool:
    return fd.type == FieldDescriptor.TYPE_MESSAGE and fd.message_type.GetOptions().map_entry


@cache
def _hints(cls: Any) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def decode(msg: Message, record: type[T], **overrides: Any) -> T:
    """A `record` built from the message's fields of the same names (and the overrides)."""
    fields: Descriptor = msg.DESCRIPTOR
    hints = _hints(typing.cast(Any, record))
    values: dict[str, Any] = {}
    for f in dataclasses.fields(typing.cast(Any, record)):
        if f.name in overrides:
            values[f.name] = overrides[f.name]
            continue
        fd = fields.fields_by_name.get(f.name)
        if fd is None:
            continue
        has = fields.fields_by_name.get(f"has_{f.name}")
        if has is not None and not getattr(msg, has.name):
            values[f.name] = None
        elif not (fd.has_presence and not fd.is_repeated and not msg.HasField(f.name)):
            values[f.name] = _value(hints[f.name], fd, getattr(msg, f.name))
    return record(**values)


def _value(hint: Any, fd: FieldDescriptor, value: Any) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        (hint,) = [a for a in args if a is not type(None)]
        origin, args = typing.get_origin(hint), typing.get_args(hint)
    if _is_map(fd):
        item = fd.message_type.fields_by_name["value"]
        return {k: _value(args[1], item, v) for k, v in value.items()}
    if fd.is_repeated:
        items = [_item(args[0] if args else Any, fd, v) for v in value]
        return tuple(items) if origin is tuple else items
    return _item(hint, fd, value)


def _item(hint: Any, fd: FieldDescriptor, value: Any) -> Any:
    if fd.type == FieldDescriptor.TYPE_MESSAGE:
        return decode(value, typing.cast(type, hint)) if dataclasses.is_dataclass(hint) else value
    if fd.type == FieldDescriptor.TYPE_ENUM:
        name = enum_name(fd.enum_type, value)
        if isinstance(hint, type) and issubclass(hint, enum.Enum):
            if name not in hint.__members__:
                raise ValueError(f"{fd.full_name}: wire value {value} is not a {hint.__name__}")
            return hint[name]
        return name
    if fd.type == FieldDescriptor.TYPE_STRING and hint is not str:
        return json.loads(value) if value else None
    return value
