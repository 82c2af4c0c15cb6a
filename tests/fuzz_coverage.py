"""Coverage-guided fuzzing (atheris, libFuzzer) of every parser that reads what a stranger or a
harness wrote, with the same oracles as the property-based tests in `test_fuzz.py`: each input
is accepted or refused with the parser's own clear error, and nothing else escapes.

    .venv/bin/python -m tests.fuzz_coverage TARGET [--seconds N] [--dir DIR]

Targets: spec, image-config, gateway, manifest, archive. A crash prints the exception and the
input, writes the input to `DIR/corpus/crashes/`, and exits non-zero. `make fuzz`
runs every target for longer; `tests/test_fuzz.py` runs each one briefly in `make test`.
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import sys
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import atheris

with atheris.instrument_imports(include=["orchestrator", "sandbox_agent", "snapshots", "protos"]):
    from orchestrator.client import spec_from_mapping
    from orchestrator.domain import InvalidArgument
    from orchestrator.gateway import PROTOCOLS, GatewayError
    from sandbox_agent.images.oci import ImageConfig
    from snapshots import InvalidCheckpoint, SnapshotCorrupt, SnapshotStore, import_checkpoint_archive

_KEYS = ["image", "command", "entrypoint", "env", "files", "resources", "limits", "preemption", "labels",
         "reward", "cwd", "user", "model", "messages", "input", "prompt", "tools", "stream", "max_tokens",
         "system", "role", "content", "tool_calls", "tool_call_id", "type", "name", "arguments", "text",
         "config", "Entrypoint", "Cmd", "Env", "User", "WorkingDir", "Labels", "memory_mb", "priority"]  # fmt: skip


def _value(fdp: atheris.FuzzedDataProvider, depth: int = 0) -> Any:
    """A JSON value steered by the input's bytes: the fuzzer learns which bytes reach which branch."""
    kind = fdp.ConsumeIntInRange(0, 7 if depth < 4 else 4)
    if kind == 0:
        return None
    if kind == 1:
        return fdp.ConsumeBool()
    if kind == 2:
        return fdp.ConsumeInt(9)
    if kind == 3:
        return fdp.ConsumeRegularFloat() if fdp.ConsumeBool() else fdp.ConsumeFloat()
    if kind == 4:
        return fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 24))
    if kind == 5:
        return [_value(fdp, depth + 1) for _ in range(fdp.ConsumeIntInRange(0, 4))]
    return {_key(fdp): _value(fdp, depth + 1) for _ in range(fdp.ConsumeIntInRange(0, 5))}


def _key(fdp: atheris.FuzzedDataProvider) -> str:
    if fdp.ConsumeBool():
        return _KEYS[fdp.ConsumeIntInRange(0, len(_KEYS) - 1)]
    return fdp.ConsumeUnicodeNoSurrogates(8)


def spec(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    doc = {"image": "base", "command": ["true"]} if fdp.ConsumeBool() else {}
    doc.update({_key(fdp): _value(fdp) for _ in range(fdp.ConsumeIntInRange(0, 6))})
    try:
        spec_from_mapping(doc)
    except InvalidArgument as exc:
        if not (exc.field and str(exc).startswith(exc.field)):
            raise AssertionError(f"a refusal that names no field: {exc}") from exc


def image_config(data: bytes) -> None:
    value = _value(atheris.FuzzedDataProvider(data))
    parsed = ImageConfig.from_oci(value if isinstance(value, dict) else {"config": value})
    if ImageConfig.from_json(parsed.to_json()) != parsed:
        raise AssertionError("an image config does not survive its own round trip")


def gateway(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    paths = sorted(PROTOCOLS)
    protocol = PROTOCOLS[paths[fdp.ConsumeIntInRange(0, len(paths) - 1)]]
    body = {_key(fdp): _value(fdp) for _ in range(fdp.ConsumeIntInRange(0, 6))}
    try:
        protocol.parse(body)
    except GatewayError as err:
        if not 400 <= err.status < 500 or not json.loads(protocol.error(err)):
            raise AssertionError(f"a refusal without a 4xx status in the protocol's shape: {err}") from err


class _Manifests:
    """A store holding one real snapshot whose manifest file each input replaces."""

    def __init__(self, root: Path) -> None:
        from tests.snapshots.conftest import make_meta, make_tree

        self.store = SnapshotStore.open(f"file://{root / 'store'}")
        self.store.put(make_tree(root / "tree"), make_meta("snap-fuzz-1"))
        self.file = root / "store" / "snapshots" / "snap-fuzz-1.json"  # docs/snapshot-format.md
        self.seed = self.file.read_bytes()

    def __call__(self, data: bytes) -> None:
        self.file.write_bytes(data)
        try:
            self.store.manifest("snap-fuzz-1")
        except SnapshotCorrupt as exc:
            if "unreadable manifest" not in str(exc):
                raise AssertionError(f"corruption reported without naming it: {exc}") from exc


class _Archives:
    """Each input is a checkpoint archive imported into a fresh destination."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def __call__(self, data: bytes) -> None:
        with tempfile.TemporaryDirectory(dir=self.root) as tmp:
            work = Path(tmp)
            (work / "in").mkdir()
            (work / "in" / "archive.tar").write_bytes(data)
            dest = work / "out" / "checkpoint"
            dest.parent.mkdir()
            try:
                import_checkpoint_archive(work / "in" / "archive.tar", dest)
            except InvalidCheckpoint:
                if dest.exists():
                    raise AssertionError("a refused import left its destination behind") from None
            if sorted(p.name for p in work.iterdir()) != ["in", "out"]:
                raise AssertionError(f"the importer wrote outside its destination: {list(work.iterdir())}")

    @staticmethod
    def seed() -> bytes:
        """A small archive of the standard layout, for the fuzzer to start from."""
        buf = io.BytesIO()
        files = {"config.dump": b'{"id": "x"}', "spec.dump": b"{}", "checkpoint/inventory.img": b"\0" * 8,
                 "rootfs-diff.tar": b"", "stasis-checkpoint.json": b"{}"}  # fmt: skip
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for name, content in files.items():
                info = tarfile.TarInfo(name)
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))
        return buf.getvalue()


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m tests.fuzz_coverage")
    p.add_argument("target", choices=["spec", "image-config", "gateway", "manifest", "archive"])
    p.add_argument("--seconds", type=int, default=60)
    p.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="corpus and scratch space, kept between runs (default .cache/fuzz/TARGET)",
    )
    a = p.parse_args()
    home = a.dir or Path(__file__).resolve().parent.parent / ".cache" / "fuzz" / a.target
    corpus, work = home / "corpus", home / "work"
    shutil.rmtree(work, ignore_errors=True)  # libFuzzer ends the process itself: no clean-up after
    for d in (corpus / "crashes", work):
        d.mkdir(parents=True, exist_ok=True)
    target: Callable[[bytes], None]
    if a.target == "manifest":
        manifests = _Manifests(work)
        (corpus / "seed-manifest").write_bytes(manifests.seed)
        target = manifests
    elif a.target == "archive":
        (corpus / "seed-archive").write_bytes(_Archives.seed())
        target = _Archives(work)
    else:
        target = {"spec": spec, "image-config": image_config, "gateway": gateway}[a.target]
    libfuzzer = [sys.argv[0], f"-max_total_time={a.seconds}", f"-artifact_prefix={corpus}/crashes/",
                 "-rss_limit_mb=4096", "-print_final_stats=1", str(corpus)]  # fmt: skip
    atheris.Setup(libfuzzer, target)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
