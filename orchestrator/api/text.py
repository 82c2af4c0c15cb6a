"""Text in a request never holds a NUL character. No program takes one in its argv, no id or name
has one, and PostgreSQL's text columns refuse it. `rpc` checks every request before its handler
runs, so the caller learns which field is wrong instead of getting an internal error later."""

from __future__ import annotations

from collections.abc import Iterator

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from orchestrator.domain import InvalidArgument

_STRING = FieldDescriptor.TYPE_STRING
_MESSAGE = FieldDescriptor.TYPE_MESSAGE


def refuse_nul(request: Message) -> None:
    """Raise InvalidArgument naming the first text field of `request` that holds a NUL."""
    for name, text in _texts(request, ""):
        if "\0" in text:
            raise InvalidArgument(name, "must not contain a NUL character")


def _texts(message: Message, prefix: str) -> Iterator[tuple[str, str]]:
    """Every string a message holds, nested ones and map keys included, with its field path
    (`submits[2].spec.labels.team`)."""
    for field, value in message.ListFields():
        name = prefix + field.name
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            value_type = field.message_type.fields_by_name["value"].type
            for key, item in value.items():
                path = f"{name}.{key}".replace("\0", "\\0")  # the error names it, printable
                if isinstance(key, str):
                    yield path, key
                if value_type == _STRING:
                    yield path, item
                elif value_type == _MESSAGE:
                    yield from _texts(item, path + ".")
        elif field.type not in (_STRING, _MESSAGE):
            continue
        elif not field.is_repeated:
            if field.type == _STRING:
                yield name, value
            else:
                yield from _texts(value, name + ".")
        else:
            for i, item in enumerate(value):
                if field.type == _STRING:
                    yield f"{name}[{i}]", item
                else:
                    yield from _texts(item, f"{name}[{i}].")
