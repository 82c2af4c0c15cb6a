"""fsck for the store: read every chunk a set of manifests references and report all problems."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ._chunkstore import ChunkStore
from ._errors import SnapshotCorrupt, SnapshotNotFound
from ._manifest import Manifest


@dataclass(frozen=True)
class Problem:
    """One defect: kind is missing-chunk, hash-mismatch, length-mismatch, undecodable-chunk or unreadable-manifest."""

    kind: str
    snapshot_id: str
    path: str | None
    chunk: str | None
    detail: str

    def __str__(self) -> str:
        where = f"snapshot {self.snapshot_id}"
        if self.path is not None:
            where += f" file {self.path}"
        if self.chunk is not None:
            where += f" chunk {self.chunk}"
        return f"{self.kind}: {where}: {self.detail}"


@dataclass(frozen=True)
class VerifyReport:
    """Outcome of a verify run."""

    snapshots_checked: tuple[str, ...]
    chunks_checked: int
    problems: tuple[Problem, ...]

    @property
    def ok(self) -> bool:
        """True when no problem was found."""
        return not self.problems


def run(
    ids: Sequence[str], load: Callable[[str], Manifest], chunks: ChunkStore, single: bool
) -> VerifyReport:
    """Verify the given snapshots; each distinct chunk is read once however many files share it."""
    problems: list[Problem] = []
    manifests: list[Manifest] = []
    checked: list[str] = []
    for snapshot_id in ids:
        try:
            manifests.append(load(snapshot_id))
        except SnapshotNotFound:
            if single:
                raise
            continue  # Deleted since it was listed.
        except SnapshotCorrupt as exc:
            problems.append(Problem("unreadable-manifest", snapshot_id, None, None, exc.detail))
        checked.append(snapshot_id)
    results = chunks.check(ref for m in manifests for e in m.files() for ref in e.chunks)
    for m in manifests:
        for entry in m.files():
            for ref in entry.chunks:
                bad = results[ref]
                if bad is not None:
                    problems.append(Problem(bad.kind, m.snapshot_id, entry.path, ref.hash, bad.detail))
    return VerifyReport(tuple(checked), len(results), tuple(problems))
