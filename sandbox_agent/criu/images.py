"""CRIU's image files, read without CRIU: after one or two magic numbers, protobuf messages each
after its length (criu/images/*.proto; only the fields read here are declared).

A fork child's host name is written into its UTS namespace's image before CRIU restores it
(`rename_host`), so its processes never see the parent's.

A restore recreates the user namespace its images describe and puts each task where its images
say, so the images decide whether the restored harness is an unprivileged host user or the
node's root. `user_namespace_problem` checks that before CRIU runs: a snapshot the node that
took it forged (a map of uid 0 to host root, or a task left in the node's own namespace) is
refused instead of restored.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError, Message

IMG_COMMON_MAGIC = 0x54564319
INVENTORY_MAGIC = 0x58313116
PSTREE_MAGIC = 0x50273030
IDS_MAGIC = 0x54432030
USERNS_MAGIC = 0x55474906
UTSNS_MAGIC = 0x54473203
SANDBOX_IDS = 65536
"""A sandbox's user namespace maps its ids 0..65535 (`AgentSettings.userns_base`)."""
MAX_SMALL_IMAGE = 1 << 20
"""Inventory, process tree, ids and user namespace images are a few bytes per task."""

_F = descriptor_pb2.FieldDescriptorProto


def _message_classes() -> dict[str, type[Message]]:
    proto = descriptor_pb2.FileDescriptorProto(
        name="stasis/criu/tasks.proto", package="stasis.criu", syntax="proto2"
    )

    def message(name: str, *fields: tuple[str, int, str]) -> None:
        """Fields are optional uint32s, strings, or `type_name` repeated messages: all the reads need."""
        m = proto.message_type.add(name=name)
        for field_name, number, type_name in fields:
            if type_name == "string":
                m.field.add(name=field_name, number=number, type=_F.TYPE_STRING, label=_F.LABEL_OPTIONAL)
            elif type_name:
                m.field.add(name=field_name, number=number, type=_F.TYPE_MESSAGE,
                            label=_F.LABEL_REPEATED, type_name=f".stasis.criu.{type_name}")  # fmt: skip
            else:
                m.field.add(name=field_name, number=number, type=_F.TYPE_UINT32, label=_F.LABEL_OPTIONAL)

    message("TaskKobjIds", ("user_ns_id", 10, ""))
    message("Inventory", ("root_ids", 3, "TaskKobjIds"))
    message("Pstree", ("pid", 1, ""))
    message("UidGidExtent", ("first", 1, ""), ("lower_first", 2, ""), ("count", 3, ""))
    message("Userns", ("uid_map", 1, "UidGidExtent"), ("gid_map", 2, "UidGidExtent"))
    message("Utsns", ("nodename", 1, "string"), ("domainname", 2, "string"))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return {
        m.name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"stasis.criu.{m.name}"))
        for m in proto.message_type
    }


_MESSAGES = _message_classes()


def messages(
    raw: bytes, name: str, magic: int, kind: type[Message], head: type[Message] | None = None
) -> list[Any]:
    """The messages of an image whose magic is `magic` (behind CRIU's common magic, except the
    inventory's), the first of type `head` if given (a pagemap's); ValueError naming the image
    if it is not one or is damaged."""
    magics = (magic,) if magic == INVENTORY_MAGIC else (IMG_COMMON_MAGIC, magic)
    at = 4 * len(magics)
    if len(raw) < at or struct.unpack_from(f"<{len(magics)}I", raw) != magics:
        raise ValueError(f"{name} is not the CRIU image its name says")
    out: list[Any] = []
    try:
        while at < len(raw):
            (size,) = struct.unpack_from("<I", raw, at)
            if at + 4 + size > len(raw):
                raise ValueError(f"{name} is damaged: a message runs past its end")
            out.append((head if head and not out else kind).FromString(raw[at + 4 : at + 4 + size]))
            at += 4 + size
    except (struct.error, DecodeError) as exc:
        raise ValueError(f"{name} is damaged: {exc}") from exc
    return out


def user_namespace_problem(images: Path, base: int) -> str:
    """Why the tasks these images describe would not be restored as a sandbox's, in a user
    namespace mapping ids 0..65535 to host ids from `base`, and only that one; "" if they would."""

    def read(name: str, magic: int, kind: str) -> list[Any]:
        path = images / name
        if not path.is_file() or path.is_symlink():
            raise ValueError(f"{name} is missing")
        if path.stat().st_size > MAX_SMALL_IMAGE:
            raise ValueError(f"{name} holds {path.stat().st_size} bytes")
        return messages(path.read_bytes(), name, magic, _MESSAGES[kind])

    expected = [(0, base, SANDBOX_IDS)]

    def extents(entries: Any) -> list[tuple[int, int, int]]:
        return [(e.first, e.lower_first, e.count) for e in entries]

    try:
        inventory = read("inventory.img", INVENTORY_MAGIC, "Inventory")
        host_ns = inventory[0].root_ids[0].user_ns_id if inventory and inventory[0].root_ids else None
        tasks = [entry.pid for entry in read("pstree.img", PSTREE_MAGIC, "Pstree")]
        if not tasks:
            return "pstree.img names no task"
        checked: dict[int, str] = {}
        for pid in tasks:
            ids = read(f"ids-{pid}.img", IDS_MAGIC, "TaskKobjIds")
            if not ids or not ids[0].HasField("user_ns_id") or ids[0].user_ns_id == host_ns:
                return f"task {pid} would run in the node's own user namespace"
            ns = ids[0].user_ns_id
            if ns not in checked:
                (userns, *_) = read(f"userns-{ns}.img", USERNS_MAGIC, "Userns") or [None]
                maps = (extents(userns.uid_map), extents(userns.gid_map)) if userns else ([], [])
                checked[ns] = (
                    ""
                    if maps == (expected, expected)
                    else f"user namespace {ns} maps uids {maps[0]} and gids {maps[1]}, not {expected}"
                )
            if checked[ns]:
                return f"task {pid}: {checked[ns]}"
    except ValueError as exc:
        return str(exc)
    return ""


def rename_host(images: Path, hostname: str) -> None:
    """Name the host of every UTS namespace these images hold `hostname`, in place (the images
    must be the restore's own copy). ValueError if they hold none, or one is damaged."""
    found = 0
    for path in sorted(images.glob("utsns-*.img")):
        if not path.is_file() or path.is_symlink() or path.stat().st_size > MAX_SMALL_IMAGE:
            raise ValueError(f"{path.name} is not a UTS namespace's image")
        entries = messages(path.read_bytes(), path.name, UTSNS_MAGIC, _MESSAGES["Utsns"])
        if len(entries) != 1:
            raise ValueError(f"{path.name} holds {len(entries)} entries, not one")
        entries[0].nodename = hostname
        body = entries[0].SerializeToString()
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_bytes(struct.pack("<3I", IMG_COMMON_MAGIC, UTSNS_MAGIC, len(body)) + body)
        tmp.replace(path)
        found += 1
    if not found:
        raise ValueError("no UTS namespace's image (utsns-*.img) is among them")
