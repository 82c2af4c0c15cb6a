"""Policy versions a trainer can order: published versions only go up, a refused one names its
field and changes nothing, the published version survives a reopened store (SQLite and
PostgreSQL, and a SQLite file from before the table), and samples carry each token's staleness
against it. Through the public API and `stasis policy publish` too."""

from __future__ import annotations

import io
import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from orchestrator import InvalidArgument, StasisClient
from orchestrator.api import Orchestrator, OrchestratorSettings
from orchestrator.cli import main
from orchestrator.domain import NodeRecord, NodeState
from orchestrator.trajectory import CanonicalRequest, Ledger, Turn, samples
from orchestrator.trajectory.policy import oldest_staleness, staleness
from orchestrator.trajectory.turns import extension
from protos.stasis.v1 import stasis_pb2 as pb
from protos.stasis.v1 import stasis_pb2_grpc as pb_grpc
from tests.orchestrator.ledgers import DATABASES, OpenLedger, opener


@pytest.fixture(params=DATABASES)
def open_ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[OpenLedger]:
    with opener(request, tmp_path / "ledger.db") as open_:
        yield open_


@pytest.mark.timeout(60)
def test_versions_only_go_up_and_a_refused_one_names_the_field_and_changes_nothing(
    open_ledger: OpenLedger,
) -> None:
    policy = open_ledger().policy
    assert policy.published() == 0 and policy.current().published_at == 0
    first = policy.publish(3)
    assert first.version == 3 and first.published_at > 0 and policy.current() == first
    for refused, why in ((3, "not above the published version 3"), (2, "not above"), (0, "positive"),
                         (-1, "positive")):  # fmt: skip
        with pytest.raises(InvalidArgument) as err:
            policy.publish(refused)
        assert err.value.field == "version" and why in err.value.problem, err.value
        assert policy.current() == first, "a refused version changes nothing"
    assert policy.publish(7).version == 7 and policy.published() == 7


@pytest.mark.timeout(60)
def test_the_published_version_survives_a_reopened_store(open_ledger: OpenLedger) -> None:
    first = open_ledger()
    published = first.policy.publish(12)
    first.close()
    reopened = open_ledger()
    assert reopened.policy.current() == published
    with pytest.raises(InvalidArgument):
        reopened.policy.publish(12)
    assert reopened.policy.publish(13).version == 13


@pytest.mark.timeout(30)
def test_a_ledger_from_before_policy_versions_gains_their_table(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    Ledger.sqlite(path).close()
    with sqlite3.connect(path) as db:
        db.execute("DROP TABLE policy_versions")  # as a state dir written before it existed
    ledger = Ledger.sqlite(path)
    try:
        assert ledger.policy.published() == 0
        ledger.policy.publish(1)
    finally:
        ledger.close()
    reopened = Ledger.sqlite(path)
    try:
        assert reopened.policy.published() == 1
    finally:
        reopened.close()


def _turn(
    turn_id: int, prompt: list[int], sampled: list[int], version: str, parent: Turn | None = None
) -> Turn:
    fields: dict[str, Any] = dict(
        id=turn_id, episode_id="ep", parent_id=parent.id if parent else None, branch=0, run=1, kind="chat",
        request_raw=b"", response=b"", protocol="chat", delivered=b"", delivered_run=1, delivered_at=None,
        token_ids=sampled, logprobs=[-0.5] * len(sampled), prompt_token_ids=prompt, policy_version=version,
        abandoned=False, replays=0, created_at=0.0, lineage=extension(parent, prompt), logprobs_mode="processed",
    )  # fmt: skip
    return Turn(**fields)


@pytest.mark.timeout(10)
def test_samples_carry_each_tokens_staleness_against_the_published_version() -> None:
    t1 = _turn(1, [1, 2], [10, 11], "3")
    t2 = _turn(2, [1, 2, 10, 11, 4], [12], "5", parent=t1)
    t3 = _turn(3, [1, 2, 10, 11, 4, 12, 5], [13, 14], "policy-v1", parent=t2)  # an upstream's own name
    (sample,) = samples([t1, t2, t3], published=6)
    assert sample.published_version == 6
    assert sample.policy_versions == ["", "", "3", "3", "", "5", "", "policy-v1", "policy-v1"]
    assert sample.staleness == [0, 0, 3, 3, 0, 1, 0, 0, 0]
    assert sample.staleness_known == [False, False, True, True, False, True, False, False, False]
    (unpublished,) = samples([t1, t2, t3])
    assert unpublished.published_version == 0 and not any(unpublished.staleness_known)
    assert staleness(6, " 4 ") == 2 and staleness(0, "4") is None and staleness(6, "") is None
    assert oldest_staleness(["3", "5", "policy-v1", ""], 6) == 3, "the hook a group's max_staleness reads"
    assert oldest_staleness(["policy-v1"], 6) is None


@pytest.mark.timeout(120)
def test_publish_policy_over_the_api_and_the_cli_and_after_a_restart(tmp_path: Path) -> None:
    settings = OrchestratorSettings(state_dir=tmp_path / "state", listen="127.0.0.1:0")
    first = Orchestrator(settings).start(gateway=False)
    try:
        with StasisClient(first.address) as client:
            assert client.publish_policy(4).version == 4
            with pytest.raises(InvalidArgument) as err:
                client.publish_policy(4)
            assert err.value.field == "version" and "not above the published version 4" in err.value.problem
        out, errors = io.StringIO(), io.StringIO()
        assert main(["--addr", first.address, "policy", "publish", "5"], out, errors) == 0, errors.getvalue()
        assert out.getvalue() == "policy version 5 published\n"
        assert main(["--addr", first.address, "policy", "publish", "2"], out, errors) == 1
        assert "version: 2 is not above the published version 5" in errors.getvalue()
        assert first.ledger.policy.published() == 5
        with grpc.insecure_channel(first.address) as channel:  # a retry whose first answer was lost
            stub = pb_grpc.StasisStub(channel)
            retried = [
                stub.PublishPolicy(pb.PublishPolicyRequest(version=9, request_id="step-9")) for _ in "ab"
            ]
        assert [r.version for r in retried] == [9, 9], "a retry is not refused as equal"
    finally:
        first.stop()
    second = Orchestrator(settings).start(gateway=False)
    try:
        assert second.ledger.policy.published() == 9
        with StasisClient(second.address) as client:
            assert client.publish_policy(10).version == 10
    finally:
        second.stop()


@pytest.mark.timeout(120)
def test_the_api_and_stasis_trajectory_give_each_tokens_staleness(tmp_path: Path) -> None:
    running = Orchestrator(OrchestratorSettings(state_dir=tmp_path / "state", listen="127.0.0.1:0"))
    running.start(gateway=False)
    try:
        # No agent runs: a cordoned node record that caches the image lets the episode be submitted.
        running.store.nodes.upsert(
            NodeRecord("node-1", "127.0.0.1:1", NodeState.CORDONED, "runc", 1, 1024,
                       {"sha256:" + "a" * 64: ["base"]}, {}, time.time())
        )  # fmt: skip
        with StasisClient(running.address) as client:
            episode = client.submit({"image": "base", "command": ["true"]})
            request = CanonicalRequest.parse(
                "chat", {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            )
            running.ledger.record(
                episode.id, 1, 0.0, request, b"{}", {"role": "assistant", "content": "hello"}, b"response",
                "chat", b"delivered", [7, 8], [-0.5, -0.25], [1, 2, 3], "4", 1.0,
            )  # fmt: skip
            assert client.trajectory(episode.id).samples[0].staleness_known == [False] * 5, "none published"
            client.publish_policy(6)
            (sample,) = client.trajectory(episode.id).samples
            assert sample.published_version == 6 and sample.policy_versions == ["", "", "", "4", "4"]
            assert sample.staleness == [0, 0, 0, 2, 2]
            assert sample.staleness_known == [False, False, False, True, True]
        out, errors = io.StringIO(), io.StringIO()
        assert main(["--addr", running.address, "trajectory", episode.id, "-o", "json"], out, errors) == 0
        (shown,) = json.loads(out.getvalue())["samples"]
        assert shown["published_version"] == 6 and shown["staleness"] == [0, 0, 0, 2, 2]
        assert shown["staleness_known"] == [False, False, False, True, True]
        out = io.StringIO()
        assert main(["--addr", running.address, "trajectory", episode.id], out, errors) == 0, (
            errors.getvalue()
        )
        assert "policy version 6 published: sampled tokens 2 to 2 versions stale" in out.getvalue()
    finally:
        running.stop()
