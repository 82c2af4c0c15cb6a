"""Property-based fuzzing of every parser that reads what a stranger or a harness wrote: the
episode-spec parser, the snapshot manifest reader, the checkpoint archive importer, the OCI
image-config reader and each gateway protocol. Whatever the input, each one either accepts it
or refuses it with its own clear error; nothing else escapes, and nothing is written outside
the destination it was given."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.client import spec_from_mapping
from orchestrator.domain import InvalidArgument
from orchestrator.gateway import PROTOCOLS, GatewayError
from sandbox_agent.images.oci import ImageConfig
from snapshots import InvalidCheckpoint, SnapshotCorrupt, SnapshotStore, import_checkpoint_archive
from tests.snapshots.conftest import make_meta, make_tree

FUZZ = settings(
    max_examples=int(os.environ.get("STASIS_FUZZ_EXAMPLES", "400")),
    deadline=None,
    derandomize=not os.environ.get("STASIS_FUZZ_EXAMPLES"),
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)

scalars = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=20)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20,
)

SPEC_KEYS = ["image", "command", "entrypoint", "env", "files", "resources", "limits", "preemption",
             "labels", "reward", "cwd", "user"]  # fmt: skip
spec_like = st.fixed_dictionaries(
    {"image": st.sampled_from(["base", "", "registry.internal:5000/a/b:1", "x" * 300]) | json_values},
    optional={k: json_values for k in SPEC_KEYS[1:]}
    | {"command": st.lists(st.text(max_size=8), max_size=3) | json_values},
)


@pytest.mark.timeout(120)
@FUZZ
@given(spec_like | st.dictionaries(st.text(max_size=12), json_values, max_size=6))
def test_the_spec_parser_accepts_or_names_the_field(data: dict[str, Any]) -> None:
    try:
        spec_from_mapping(data)
    except InvalidArgument as exc:
        assert exc.field and str(exc).startswith(exc.field), str(exc)


@pytest.mark.timeout(120)
@FUZZ
@given(json_values)
def test_the_image_config_reader_takes_any_json(config: Any) -> None:
    parsed = ImageConfig.from_oci(config if isinstance(config, dict) else {"config": config})
    assert all(isinstance(a, str) for a in (*parsed.entrypoint, *parsed.cmd, *parsed.env))
    assert ImageConfig.from_json(parsed.to_json()) == parsed


messages = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "assistant", "system", "tool", "developer", 7])},
        optional={"content": json_values | st.text(max_size=20), "tool_calls": json_values,
                  "tool_call_id": json_values, "name": json_values},
    ),
    max_size=4,
)  # fmt: skip
request_like = st.fixed_dictionaries(
    {},
    optional={"model": json_values, "messages": messages | json_values, "input": messages | json_values,
              "prompt": json_values, "tools": json_values, "stream": json_values, "max_tokens": json_values,
              "system": json_values, "temperature": json_values, "tool_choice": json_values,
              "instructions": json_values, "seed": json_values},
)  # fmt: skip


@pytest.mark.timeout(120)
@FUZZ
@given(st.sampled_from(sorted(PROTOCOLS)), request_like | st.dictionaries(st.text(max_size=10), json_values))
def test_every_gateway_protocol_parses_or_refuses_with_its_error_shape(
    path: str, body: dict[str, Any]
) -> None:
    protocol = PROTOCOLS[path]
    try:
        protocol.parse(body)
    except GatewayError as err:
        assert 400 <= err.status < 500
        shaped = json.loads(protocol.error(err))
        assert shaped, "the refusal is in the protocol's own error shape"


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> tuple[SnapshotStore, Path, bytes]:
    """A store holding one snapshot, the file of its manifest, and that manifest's bytes."""
    root = tmp_path_factory.mktemp("store")
    store = SnapshotStore.open(f"file://{root / 'store'}")
    store.put(make_tree(root / "tree"), make_meta("snap-fuzz-1"))
    manifest = root / "store" / "snapshots" / "snap-fuzz-1.json"  # docs/snapshot-format.md
    return store, manifest, manifest.read_bytes()


def _mutate(doc: Any, path: list[int], value: Any) -> Any:
    """Replace the value a path of indexes leads to (each index picks a key or an item)."""
    if not path or not isinstance(doc, dict | list) or not doc:
        return value
    keys = list(doc) if isinstance(doc, dict) else list(range(len(doc)))
    key = keys[path[0] % len(keys)]
    copy: Any = dict(doc) if isinstance(doc, dict) else list(doc)
    copy[key] = _mutate(doc[key], path[1:], value)
    return copy


@pytest.mark.timeout(120)
@FUZZ
@given(st.lists(st.integers(0, 50), max_size=5), json_values, st.binary(max_size=40))
def test_the_manifest_reader_reads_or_reports_corruption(
    stored: tuple[SnapshotStore, Path, bytes], path: list[int], value: Any, noise: bytes
) -> None:
    store, manifest, raw = stored
    mutated = json.dumps(_mutate(json.loads(raw), path, value)).encode()
    try:
        for candidate in (mutated, raw[: len(noise)] + noise):
            manifest.write_bytes(candidate)
            try:
                store.manifest("snap-fuzz-1")
            except SnapshotCorrupt as exc:
                assert "unreadable manifest" in str(exc)
    finally:
        manifest.write_bytes(raw)
    assert store.manifest("snap-fuzz-1").snapshot_id == "snap-fuzz-1"


names = st.sampled_from(["config.dump", "spec.dump", "checkpoint/core-1.img", "rootfs-diff.tar",
                         "deleted.files", "stasis-checkpoint.json", "../escape", "/abs", "checkpoint/../../x",
                         "checkpoint", "a/b/c"])  # fmt: skip
members = st.lists(
    st.tuples(names, st.sampled_from([tarfile.REGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE]),
              st.binary(max_size=64), st.sampled_from(["", "../../etc/passwd", "/etc", "checkpoint"])),
    max_size=6,
)  # fmt: skip


def _archive(items: list[tuple[str, bytes, bytes, str]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, kind, content, link in items:
            info = tarfile.TarInfo(name)
            info.type, info.linkname = kind, link  # type: ignore[assignment]
            info.size = len(content) if kind == tarfile.REGTYPE else 0
            tar.addfile(info, io.BytesIO(content) if kind == tarfile.REGTYPE else None)
    return buf.getvalue()


@pytest.mark.timeout(180)
@FUZZ
@given(members, st.binary(max_size=64), st.booleans())
def test_the_archive_importer_imports_or_refuses_and_writes_nothing_outside(
    items: list[tuple[str, bytes, bytes, str]], noise: bytes, garbage: bool
) -> None:
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        work = Path(tmp)
        archive = work / "in" / "archive.tar"
        archive.parent.mkdir()
        archive.write_bytes(noise if garbage else _archive(items))
        dest = work / "out" / "checkpoint"
        dest.parent.mkdir()
        try:
            import_checkpoint_archive(archive, dest)
        except InvalidCheckpoint:
            assert not dest.exists(), "a refused import leaves nothing"
        assert sorted(p.name for p in work.iterdir()) == ["in", "out"]
        assert [p.name for p in (work / "in").iterdir()] == ["archive.tar"]
        assert [p.name for p in dest.parent.iterdir()] in ([], ["checkpoint"]), "no partial left"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("target", ["spec", "image-config", "gateway", "manifest", "archive"])
def test_a_coverage_guided_pass_finds_no_crash(target: str, tmp_path: Path) -> None:
    """A short atheris (libFuzzer) run per parser with the same oracles; `make fuzz` runs longer."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.fuzz_coverage", target, "--seconds", "8", "--dir", str(tmp_path)],
        cwd=Path(__file__).resolve().parent.parent,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Done " in done.stderr and not list((tmp_path / "corpus" / "crashes").iterdir())
