"""The one id module, the plain-data codec (spec files and storage) and the wire codec (protobuf)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from orchestrator.api.messages import episode_to_pb
from orchestrator.client import EpisodeInfo, load_spec_file, spec_from_mapping
from orchestrator.domain import (
    Episode,
    EpisodeSpec,
    EpisodeState,
    InvalidArgument,
    Limits,
    Preemption,
    Resources,
    RewardSpec,
    codec,
    ids,
)
from protos.shared import wire
from protos.stasis.v1 import stasis_pb2 as pb

SPEC = EpisodeSpec(
    image="base",
    command=("python3", "agent.py"),
    env={"A": "1"},
    files={"/task.txt": "caf\u00e9\n".encode(), "/blob.bin": b"\xff\x00\xfe"},
    resources=Resources(cpus=2.0, memory_mb=512),
    limits=Limits(max_wall_s=60),
    preemption=Preemption(time_slice_s=5, priority=3, autosave_s=2),
    labels={"suite": "codec"},
    reward=RewardSpec(command=("python3", "/grade.py"), files={"/grade.py": b"print(1)\n"}, timeout_s=30),
)


@pytest.mark.timeout(10)
def test_ids_are_made_and_parsed_in_one_place() -> None:
    episode = ids.new_episode_id()
    assert ids.SandboxId.parse(ids.sandbox_id(episode, 12)) == ids.SandboxId(episode, 12)
    assert ids.SnapshotId.parse(ids.snapshot_id(episode, 3)) == ids.SnapshotId(episode, 3)
    for other in (f"{episode}-r1-verify", f"{episode}-r0", "ep-x-r1", f"{episode}-s1", ""):
        assert ids.SandboxId.parse(other) is None, other
    assert ids.SnapshotId.parse(ids.sandbox_id(episode, 1)) is None
    with pytest.raises(InvalidArgument, match="address_pool"):
        ids.address_pool("10.0.0.0/31")


@pytest.mark.timeout(10)
def test_plain_data_round_trips_binary_files_and_defaults_come_from_the_dataclasses() -> None:
    plain = codec.encode(SPEC)
    assert plain["files"]["/task.txt"] == "caf\u00e9\n" and plain["files"]["/blob.bin"] == {"base64": "/wD+"}
    assert codec.decode(EpisodeSpec, plain, "spec") == SPEC
    minimal = spec_from_mapping({"image": "base", "command": ["true"], "reward": {"command": ["true"]}})
    assert minimal.resources == Resources() and minimal.preemption == Preemption()
    assert minimal.reward is not None and minimal.reward.timeout_s == RewardSpec(command=("x",)).timeout_s


@pytest.mark.parametrize(
    ("data", "field", "words"),
    [
        ({"command": ["true"]}, "spec.image", "is required"),
        ({"image": "base", "entrypoint": "sh"}, "spec.entrypoint", "not 'sh'"),
        ({"image": "base", "command": "run"}, "spec.command", "not 'run'"),
        ({"image": "base", "command": ["a", 3]}, "spec.command[1]", "must be a string, not 3"),
        (
            {"image": "base", "command": ["a"], "resources": {"gpus": 1}},
            "spec.resources.gpus",
            "is not a field",
        ),
        (
            {"image": "base", "command": ["a"], "resources": {"memory_mb": 1.5}},
            "spec.resources.memory_mb",
            "whole number",
        ),
        (
            {"image": "base", "command": ["a"], "resources": {"cpus": True}},
            "spec.resources.cpus",
            "must be a number",
        ),
        (
            {"image": "base", "command": ["a"], "files": {"/x": {"base64": "%%"}}},
            "spec.files./x",
            "not valid base64",
        ),
        ({"image": "base", "command": ["a"], "env": ["A=1"]}, "spec.env", "must be a mapping"),
        ({"image": 7, "command": ["a"]}, "spec.image", "must be an image name"),
    ],
)
@pytest.mark.timeout(10)
def test_spec_file_errors_name_the_field(data: dict[str, object], field: str, words: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        spec_from_mapping(data)
    assert err.value.field == field and words in err.value.problem, err.value


@pytest.mark.timeout(10)
def test_spec_files_read_from_file_relative_to_themselves(tmp_path: Path) -> None:
    (tmp_path / "task.txt").write_bytes(b"\x00binary task")
    path = tmp_path / "episode.yaml"
    path.write_text(
        "spec:\n  image: base\n  command: [cat, /task]\n  files:\n    /task: {from_file: task.txt}\n"
    )
    assert load_spec_file(path).files == {"/task": b"\x00binary task"}
    # Only a user's own spec file may name local files; stored or wire specs never read the disk.
    with pytest.raises(InvalidArgument, match=r"must be text or \{base64"):
        codec.decode(
            EpisodeSpec,
            {"image": "b", "command": ["a"], "files": {"/t": {"from_file": "/etc/shadow"}}},
            "spec",
        )


@pytest.mark.timeout(10)
def test_the_wire_codec_round_trips_specs_and_leaves_unset_fields_to_the_defaults() -> None:
    assert wire.decode(wire.encode(SPEC, pb.EpisodeSpec), EpisodeSpec) == SPEC
    bare = wire.decode(
        pb.EpisodeSpec(image="base", command=["true"], reward=pb.RewardSpec(command=["g"])), EpisodeSpec
    )
    assert bare.resources == Resources() and bare.reward == RewardSpec(command=("g",))
    zero = wire.decode(
        pb.EpisodeSpec(image="base", command=["true"], resources=pb.EpisodeResources(cpus=0)), EpisodeSpec
    )
    with pytest.raises(InvalidArgument, match=r"spec\.resources\.cpus"):
        zero.validate()  # an explicit 0 is the user's, not a default


@pytest.mark.timeout(10)
def test_the_public_episode_carries_no_gateway_token() -> None:
    e = Episode(
        id=ids.new_episode_id(), spec=SPEC, state=EpisodeState.RUNNING, reason="started", submitted_at=1.0,
        updated_at=2.0, address="10.200.0.2", token="secret-token", node="node-1", reward=None, exit_code=0,
    )  # fmt: skip
    message = wire.encode(e, pb.Episode, run_seconds=5.0)
    assert b"secret-token" not in message.SerializeToString()
    assert message.state == pb.EPISODE_STATE_RUNNING and message.has_exit_code and not message.has_reward
    info = wire.decode(message, EpisodeInfo)
    assert (info.state, info.exit_code, info.reward, info.run_seconds, info.spec) == (
        EpisodeState.RUNNING, 0, None, 5.0, SPEC,
    )  # fmt: skip
    assert info.to_json()["state"] == "RUNNING" and info.image == "base" and info.priority == 3


@pytest.mark.timeout(10)
def test_no_answer_carries_the_hidden_reward_files() -> None:
    assert SPEC.reward is not None and SPEC.reward.files, "the spec under test has hidden files"
    e = Episode(
        id=ids.new_episode_id(), spec=SPEC, state=EpisodeState.RUNNING, reason="", submitted_at=1.0,
        updated_at=1.0, address="10.200.0.2", token="t", node="node-1",
    )  # fmt: skip
    message = episode_to_pb(e, 2.0)
    for content in SPEC.reward.files.values():
        assert content not in message.SerializeToString()
    info = wire.decode(message, EpisodeInfo)
    assert info.spec.reward == replace(SPEC.reward, files={}) and info.spec.files == SPEC.files
    plain = replace(e, spec=replace(SPEC, reward=None))
    assert not episode_to_pb(plain, 2.0).spec.HasField("reward"), "no reward section appears"
