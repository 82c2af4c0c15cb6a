"""CRIU's pagemap images: where each process's pages were mapped, and where they lie in its
pages file (criu/images/pagemap.proto). A lazy restore serves pages by them (`lazy`); the
snapshot store aligns a process's pages with its parent snapshot's by them (`align_memory`), so
that a page changed since is stored as a delta against its own earlier bytes."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import Message

from sandbox_agent.checkpoint import CRIU_DIR
from sandbox_agent.criu import images as criu_images
from snapshots import Alignment, Segment

PAGE = 4096
PE_LAZY = 1 << 1
PE_PRESENT = 1 << 2
PAGEMAP_MAGIC = 0x56084025


class Run(NamedTuple):
    """Consecutive pages of one process: where they are mapped and where they lie in its pages
    file. A tuple: a 2 GiB interpreter heap has thousands, read before its restore can start."""

    vaddr: int
    pages: int
    offset: int
    lazy: bool


@dataclass
class Memory:
    """One process's memory in a dump: its pages file and the runs present in it, by address."""

    pages_file: str
    runs: list[Run]

    def __post_init__(self) -> None:
        self.runs.sort(key=lambda r: r.vaddr)
        self._starts = [r.vaddr for r in self.runs]

    def find(self, vaddr: int) -> Run | None:
        i = bisect.bisect_right(self._starts, vaddr) - 1
        if i >= 0 and vaddr < self.runs[i].vaddr + self.runs[i].pages * PAGE:
            return self.runs[i]
        return None


def memories(images: Path) -> tuple[dict[int, Memory], set[str]]:
    """Every process's memory in a CRIU images directory, by pid, from its pagemap-PID.img
    files; and the pages files of other pagemaps (shared memory), which a restore reads whole."""
    tasks: dict[int, Memory] = {}
    others: set[str] = set()
    for path in sorted(images.glob("pagemap-*.img")):
        name = path.name.removeprefix("pagemap-").removesuffix(".img")
        memory = _memory(path.read_bytes(), path.name)
        if name.isdigit():
            tasks[int(name)] = memory
        else:
            others.add(memory.pages_file)
    return tasks, others


def _memory(raw: bytes, name: str) -> Memory:
    """The memory a pagemap image describes; ValueError if it is damaged."""
    head, entries = _pagemap(raw, name)
    runs, offset = [], 0
    for e in entries:
        pages = e.nr_pages or e.compat_nr_pages  # the older images have only the latter
        flags = e.flags if e.HasField("flags") else PE_PRESENT
        if flags & PE_PRESENT:
            runs.append(Run(e.vaddr, pages, offset, bool(flags & PE_LAZY)))
            offset += pages * PAGE
    return Memory(f"pages-{head.pages_id}.img", runs)


def align_memory(root: Path, parent_file: Callable[[str], bytes | None]) -> dict[str, Alignment]:
    """Where each process's pages sat in its parent snapshot's pages file, by address (a
    `snapshots.Aligner` for a checkpoint directory): a mapping that came or went between two dumps
    moves every page after it in the file, and a changed page is best stored against its own
    earlier bytes. ValueError if a pagemap is damaged."""
    tasks, _ = memories(root / CRIU_DIR)
    aligned: dict[str, Alignment] = {}
    for pid, memory in tasks.items():
        name = f"{CRIU_DIR}/pagemap-{pid}.img"
        raw = parent_file(name)
        if raw is not None:
            before = _memory(raw, f"the parent's {name}")
            aligned[f"{CRIU_DIR}/{memory.pages_file}"] = Alignment(
                f"{CRIU_DIR}/{before.pages_file}",
                list(_overlaps(memory.runs, before.runs)),
            )
    return aligned


def _overlaps(runs: Sequence[Run], before: Sequence[Run]) -> Iterator[Segment]:
    """The pages of `runs` that `before` had too, as pieces of the two pages files (both lists
    in order of address, as `Memory` keeps them)."""
    i = 0
    for run in runs:
        start, end = run.vaddr, run.vaddr + run.pages * PAGE
        while i < len(before) and before[i].vaddr + before[i].pages * PAGE <= start:
            i += 1
        j = i
        while j < len(before) and before[j].vaddr < end:
            had = before[j]
            low, high = max(start, had.vaddr), min(end, had.vaddr + had.pages * PAGE)
            yield Segment(run.offset + low - run.vaddr, had.offset + low - had.vaddr, high - low)
            j += 1


def _pagemap_messages() -> tuple[type[Message], type[Message]]:
    """CRIU's pagemap_head and pagemap_entry (criu/images/pagemap.proto), parsed by the protobuf
    runtime: a 2 GiB process has thousands of entries, too many to decode in Python loops.
    Every field is optional here, so an entry CRIU leaves out reads as absent, not as an error."""
    proto = descriptor_pb2.FileDescriptorProto(
        name="stasis/criu/pagemap.proto", package="stasis.criu", syntax="proto2"
    )
    field = descriptor_pb2.FieldDescriptorProto
    head = proto.message_type.add(name="PagemapHead")
    head.field.add(name="pages_id", number=1, type=field.TYPE_UINT32, label=field.LABEL_OPTIONAL)
    entry = proto.message_type.add(name="PagemapEntry")
    for name, number, kind in (
        ("vaddr", 1, field.TYPE_UINT64),
        ("compat_nr_pages", 2, field.TYPE_UINT32),
        ("in_parent", 3, field.TYPE_BOOL),
        ("flags", 4, field.TYPE_UINT32),
        ("nr_pages", 5, field.TYPE_UINT64),
    ):
        entry.field.add(name=name, number=number, type=kind, label=field.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return (
        message_factory.GetMessageClass(pool.FindMessageTypeByName("stasis.criu.PagemapHead")),
        message_factory.GetMessageClass(pool.FindMessageTypeByName("stasis.criu.PagemapEntry")),
    )


_PAGEMAP_HEAD, _PAGEMAP_ENTRY = _pagemap_messages()


def _pagemap(raw: bytes, name: str) -> tuple[Any, list[Any]]:
    """The head and entries of a CRIU pagemap image."""
    messages = criu_images.messages(raw, name, PAGEMAP_MAGIC, _PAGEMAP_ENTRY, head=_PAGEMAP_HEAD)
    if not messages:
        raise ValueError(f"{name} has no pagemap header")
    return messages[0], messages[1:]
