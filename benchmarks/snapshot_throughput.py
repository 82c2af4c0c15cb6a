"""Snapshot store throughput against plain `tar | zstd -3`, measured in the same run on the same files.

Usage: python benchmarks/snapshot_throughput.py [--tree DIR] [--memory-mib 256] [--workdir DIR]

Each measurement runs --repeat times (default 3), the store and tar|zstd alternating, and
the medians are shown. Without --tree it builds a checkpoint-like directory: a memory image mixing
random pages, zero pages and repeated text (runs of pages, as heaps and
mapped regions look), a few small CRIU image files and a layer tar. It then
prints local-backend write and read(+verify) throughput beside tar+zstd, and
the deduplication of a second snapshot after ~10% of the memory changed, and
last how long puts wait while a GC runs beside them (--gc-snapshots).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import itertools
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from snapshots import (
    ChunkingSettings,
    RetentionPolicy,
    SnapshotMeta,
    SnapshotSizes,
    SnapshotStore,
    StoreSettings,
)

PAGE = 4096
MiB = 1 << 20


def _text_block(rng: random.Random) -> bytes:
    words = [rng.randbytes(rng.randint(2, 9)).hex() for _ in range(2000)]
    return " ".join(rng.choice(words) for _ in range(300_000)).encode()[: 2 * MiB]


def build_memory(path: Path, size: int, seed: int) -> None:
    """Runs of random, zero and text pages: roughly 45% random, 20% zero, 35% text by volume."""
    rng = random.Random(seed)
    text = _text_block(rng)
    zero = bytes(64 * PAGE)
    written = 0
    with open(path, "wb") as f:
        while written < size:
            pages = min(rng.randint(1, 64), (size - written) // PAGE)
            kind = rng.random()
            n = pages * PAGE
            if kind < 0.45:
                f.write(rng.randbytes(n))
            elif kind < 0.65:
                f.write(zero[:n])
            else:
                start = rng.randrange(0, len(text) - n)
                f.write(text[start : start + n])
            written += n


def build_tree(root: Path, memory_mib: int) -> None:
    """A checkpoint directory shaped like the agent's: checkpoint.json, criu/, layer.tar."""
    rng = random.Random(7)
    (root / "criu").mkdir(parents=True)
    build_memory(root / "criu" / "pages-1.img", memory_mib * MiB, seed=1)
    for i in range(40):
        (root / "criu" / f"core-{i}.img").write_bytes(rng.randbytes(rng.randint(200, 20_000)))
    (root / "criu" / "descriptors.json").write_text('["/dev/null", "pipe:[1]", "pipe:[2]"]')
    layer_src = root.parent / "layer-src"
    (layer_src / "workspace").mkdir(parents=True)
    text = _text_block(rng)
    for i in range(200):
        (layer_src / "workspace" / f"file{i}.py").write_bytes(text[i * 20_000 : (i + 1) * 20_000])
    subprocess.run(["tar", "-cf", str(root / "layer.tar"), "-C", str(layer_src), "."], check=True)
    shutil.rmtree(layer_src)
    (root / "checkpoint.json").write_text(
        '{"sandbox_id": "bench", "oci_spec": {}, "created_at": "2026-01-01T00:00:00Z"}'
    )


def mutate_memory(path: Path, fraction: float, regions: int, seed: int) -> None:
    """Overwrite `fraction` of the image with fresh random bytes in a few contiguous regions."""
    rng = random.Random(seed)
    size = path.stat().st_size
    region = int(size * fraction / regions) // PAGE * PAGE
    with open(path, "r+b") as f:
        for i in range(regions):
            slot = size // regions
            start = (i * slot + rng.randrange(0, slot - region)) // PAGE * PAGE
            f.seek(start)
            f.write(rng.randbytes(region))


def scatter_pages(path: Path, fraction: float, seed: int) -> None:
    """Dirty `fraction` of the pages in small clusters of 1-8 pages, as a running heap does."""
    rng = random.Random(seed)
    pages = path.stat().st_size // PAGE
    todo = int(pages * fraction)
    with open(path, "r+b") as f:
        while todo > 0:
            n = min(rng.randint(1, 8), todo)
            f.seek(rng.randrange(0, pages - n) * PAGE)
            f.write(rng.randbytes(n * PAGE))
            todo -= n


def tree_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and not p.is_symlink())


@dataclass(frozen=True)
class Measurement:
    """Seconds for one durability mode, ours and tar+zstd's, on the same tree."""

    durable: bool
    write_s: float
    read_s: float
    tar_write_s: float
    tar_read_s: float
    tar_bytes: int
    sizes: SnapshotSizes


def measure(
    tree: Path, scratch: Path, chunking: ChunkingSettings, threads: int | None, durable: bool
) -> Measurement:
    """Time tar|zstd and the store on the same files; durable adds a sync to tar and syncfs to ours."""
    archive = scratch / "tree.tar.zst"
    untarred = scratch / "untar"
    sync = ["sync"]
    subprocess.run(sync, check=True)
    start = time.perf_counter()
    subprocess.run(["sh", "-c", f"tar -C {tree} -cf - . | zstd -3 -q -T1 -o {archive}"], check=True)
    if durable:
        subprocess.run(sync, check=True)
    tar_write_s = time.perf_counter() - start
    untarred.mkdir()
    start = time.perf_counter()
    subprocess.run(["sh", "-c", f"zstd -d -q -c {archive} | tar -C {untarred} -xf -"], check=True)
    tar_read_s = time.perf_counter() - start
    tar_bytes = archive.stat().st_size
    archive.unlink()
    shutil.rmtree(untarred)
    subprocess.run(sync, check=True)

    store_dir = scratch / "store"
    settings = StoreSettings(url=str(store_dir), chunking=chunking, durable=durable, io_threads=threads)
    with SnapshotStore(settings) as store:
        start = time.perf_counter()
        manifest = store.put(tree, meta("s1", 1, None))
        write_s = time.perf_counter() - start
        start = time.perf_counter()
        store.fetch("s1", scratch / "fetched")
        read_s = time.perf_counter() - start
    shutil.rmtree(scratch / "fetched")
    shutil.rmtree(store_dir)
    return Measurement(durable, write_s, read_s, tar_write_s, tar_read_s, tar_bytes, manifest.sizes)


def _median(runs: list[Measurement]) -> Measurement:
    """Each time the median of the runs (a shared 2-core VM is noisy); sizes from the first."""

    def mid(values: list[float]) -> float:
        return sorted(values)[len(values) // 2]

    return dataclasses.replace(
        runs[0],
        write_s=mid([r.write_s for r in runs]),
        read_s=mid([r.read_s for r in runs]),
        tar_write_s=mid([r.tar_write_s for r in runs]),
        tar_read_s=mid([r.tar_read_s for r in runs]),
    )


def meta(snapshot_id: str, seq: int, parent: str | None) -> SnapshotMeta:
    return SnapshotMeta(
        snapshot_id=snapshot_id,
        episode_id="bench",
        seq=seq,
        parent_id=parent,
        node="bench-node",
        reason="time-slice",
        created_at=datetime.datetime.now(datetime.UTC),
        image_digest="sha256:" + "0" * 64,
        runtime_backend="runc",
        criu_version="4.2.1",
    )


def gc_beside_puts(scratch: Path, snapshots: int) -> None:
    """A GC of a store that holds `snapshots` small snapshots (episodes of 4, a few with a 5th
    that retention removes), while a writer puts one every 20 ms: how long the GC took, and how
    long the slowest put meanwhile took, against a put's median."""
    url = str(scratch / "store-gc")
    tree = scratch / "gc-tree"
    memory = tree / "criu" / "pages-1.img"
    memory.parent.mkdir(parents=True)
    (tree / "checkpoint.json").write_text("{}")
    with SnapshotStore(StoreSettings(url=url)) as store:
        for i in range(snapshots):
            memory.write_bytes(os.urandom(16 << 10))
            store.put(tree, dataclasses.replace(meta(f"s{i}", i % 4 + 1, None), episode_id=f"e{i // 4}"))
        for i in range(0, snapshots // 4, 20):
            memory.write_bytes(os.urandom(16 << 10))
            store.put(tree, dataclasses.replace(meta(f"x{i}", 5, None), episode_id=f"e{i}"))
        during: list[float] = []
        outside: list[float] = []
        collecting = threading.Event()
        stop = threading.Event()

        def writer() -> None:
            with SnapshotStore(StoreSettings(url=url)) as own:
                for n in itertools.count():
                    if stop.is_set():
                        return
                    was_collecting = collecting.is_set()
                    memory.write_bytes(os.urandom(16 << 10))
                    start = time.perf_counter()
                    own.put(tree, dataclasses.replace(meta(f"w{n}", n + 1, None), episode_id="writer"))
                    took = time.perf_counter() - start
                    (during if was_collecting or collecting.is_set() else outside).append(took)
                    time.sleep(0.02)

        thread = threading.Thread(target=writer)
        thread.start()
        time.sleep(1.0)
        collecting.set()
        start = time.perf_counter()
        report = store.gc(RetentionPolicy(keep_last=4))
        gc_s = time.perf_counter() - start
        collecting.clear()
        time.sleep(1.0)
        stop.set()
        thread.join()
    print(
        f"GC of {report.kept_snapshots + len(report.deleted_snapshots)} snapshots beside a writer:"
        f" {gc_s * 1000:.0f} ms (removed {len(report.deleted_snapshots)}); {len(during)} puts meanwhile,"
        f" the slowest {max(during) * 1000:.0f} ms = {max(during) / gc_s:.2f}x the GC"
        f" (a put's median outside GC {statistics.median(outside) * 1000:.1f} ms)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--tree", type=Path, help="existing checkpoint directory to use instead of a generated one"
    )
    parser.add_argument("--memory-mib", type=int, default=256, help="size of the generated memory image")
    parser.add_argument(
        "--workdir", type=Path, default=Path("/var/tmp"), help="where scratch files go (a real disk)"
    )
    parser.add_argument("--avg-kib", type=int, default=ChunkingSettings().avg_size // 1024)
    parser.add_argument("--threads", type=int, default=None, help="io_threads (default: the store default)")
    parser.add_argument(
        "--gc-snapshots",
        type=int,
        default=1000,
        help="snapshots in the store of the GC measurement (0: none)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="runs of each measurement, alternating the two; medians are shown",
    )
    args = parser.parse_args()

    avg = args.avg_kib * 1024
    chunking = ChunkingSettings(min_size=avg // 4, avg_size=avg, max_size=avg * 4)
    with tempfile.TemporaryDirectory(prefix="stasis-bench-", dir=args.workdir) as scratch_name:
        scratch = Path(scratch_name)
        if args.tree is not None:
            tree = scratch / "tree"
            shutil.copytree(args.tree, tree, symlinks=True)
        else:
            tree = scratch / "build" / "tree"
            build_tree(tree, args.memory_mib)
        logical = tree_bytes(tree)
        mb = logical / 1e6
        print(
            f"input: {logical / MiB:.1f} MiB in {sum(1 for _ in tree.rglob('*'))} entries; chunking {chunking}"
        )
        print(f"threads: {args.threads}, cpus: {os.cpu_count()}")

        rows = [
            _median([measure(tree, scratch, chunking, args.threads, durable) for _ in range(args.repeat)])
            for durable in (False, True)
        ]
        page_cache, durable = rows
        read_s = min(r.read_s for r in rows)
        tar_read_s = min(r.tar_read_s for r in rows)
        table = [
            ("write, page cache", page_cache.write_s, page_cache.tar_write_s),
            ("write, durable", durable.write_s, durable.tar_write_s),
            ("read + verify", read_s, tar_read_s),
        ]

        memory = tree / "criu" / "pages-1.img"
        incremental = None
        if memory.exists():
            with SnapshotStore(
                StoreSettings(url=str(scratch / "store-dedup"), chunking=chunking, io_threads=args.threads)
            ) as store:
                a = store.put(tree, meta("d1", 1, None))
                mutate_memory(memory, 0.10, regions=4, seed=11)
                subprocess.run(["sync"], check=True)
                start = time.perf_counter()
                b = store.put(tree, meta("d2", 2, "d1"))
                incremental_s = time.perf_counter() - start
                scatter_pages(memory, 0.02, seed=12)
                c = store.put(tree, meta("d3", 3, "d2"))
            archive = scratch / "changed.tar.zst"
            subprocess.run(["sync"], check=True)
            start = time.perf_counter()
            subprocess.run(
                ["sh", "-c", f"tar -C {tree} -cf - . | zstd -3 -q -T1 -o {archive} && sync"], check=True
            )
            table.append(("write, 2nd snapshot", incremental_s, time.perf_counter() - start))
            incremental = (a, b, c, incremental_s)

        print()
        print("store = local backend; tar|zstd = tar -c | zstd -3 and zstd -d | tar -x of the same files")
        print(f"{'':<22}{'store MB/s':>12}{'tar|zstd MB/s':>15}{'store/tar':>11}")
        for label, ours, theirs in table:
            print(f"{label:<22}{mb / ours:>12.0f}{mb / theirs:>15.0f}{theirs / ours:>11.2f}")
        sizes = durable.sizes
        print(
            f"stored: {sizes.stored_bytes / MiB:.1f} MiB in {sizes.unique_chunks} chunks "
            f"(tar.zst {durable.tar_bytes / MiB:.1f} MiB), logical/stored {sizes.dedup_ratio:.2f}"
        )
        if incremental is not None:
            a, b, c, _ = incremental
            print(
                f"dedup, 2nd snapshot after changing 10% of memory in 4 regions: new {b.sizes.new_bytes / MiB:.1f} MiB"
                f" = {b.sizes.new_bytes / a.sizes.stored_bytes:.1%} of the first's {a.sizes.stored_bytes / MiB:.1f} MiB"
                " stored"
            )
            print(
                f"dedup, 3rd snapshot after dirtying 2% of pages in 1-8 page clusters: new "
                f"{c.sizes.new_bytes / MiB:.1f} MiB = {c.sizes.new_bytes / a.sizes.stored_bytes:.1%} of the first's"
            )
        if args.gc_snapshots:
            gc_beside_puts(scratch, args.gc_snapshots)


if __name__ == "__main__":
    main()
