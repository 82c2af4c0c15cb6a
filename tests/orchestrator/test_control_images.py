"""Images (`control/images.py`): tags pinned at submit, imports pulled on every node.

In-process, with `loops.Loop`: a real state store, a real snapshot store, and node agents
replaced by the boundary fake in `fakes` (the end-to-end tests run the real agents)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from orchestrator.api.service import StasisService
from orchestrator.control import SpecRefused
from orchestrator.domain import InvalidArgument, NotFound, PullStatus
from orchestrator.trajectory import Ledger
from protos.shared import wire
from protos.stasis.v1 import stasis_pb2 as pb
from tests.orchestrator.loops import SPEC, Loop


@pytest.mark.timeout(30)
def test_a_tag_is_pinned_once_at_submit_and_a_node_without_the_image_pulls_it(loop: Loop) -> None:
    tag, digest = "127.0.0.1:5000/team/harness:v1", "sha256:" + "d" * 64
    for name in ("node-1", "node-2"):
        loop.node(name).registry[tag] = digest
    pinned = loop.control.images.pin(tag, "spec.image")
    assert pinned == f"127.0.0.1:5000/team/harness@{digest}"
    episode_id = loop.running(replace(SPEC, image=pinned))
    e = loop.store.episodes.get(episode_id)
    assert loop.node(e.node).specs[e.sandbox_id].image == pinned, "the node is asked for the pinned bytes"
    loop.node("node-1").registry[tag] = "sha256:" + "e" * 64  # the tag moves on: the episode does not
    assert loop.store.episodes.get(episode_id).spec.image == pinned

    with pytest.raises(InvalidArgument) as err:
        loop.control.images.pin("127.0.0.1:5000/team/nothing:v1", "spec.image")
    assert (
        err.value.field == "spec.image"
        and "team/nothing" in str(err.value)
        and "manifest unknown" in str(err.value)
    )
    with pytest.raises(
        InvalidArgument, match=r"spec.image: 'nope' is not cached on any node.*known images: base"
    ):
        loop.control.images.pin("nope", "spec.image")


@pytest.mark.timeout(30)
def test_a_batch_of_submits_asks_a_node_for_each_tag_once(loop: Loop, tmp_path: Path) -> None:
    """A rollout group runs one image: its tag is pinned once for the whole SubmitEpisodes call."""
    tag, digest = "127.0.0.1:5000/team/harness:v1", "sha256:" + "d" * 64
    for name in ("node-1", "node-2"):
        loop.node(name).registry[tag] = digest
    service = StasisService(loop.control, loop.store, loop.snapshots, Ledger.sqlite(tmp_path / "ledger.db"))
    spec = wire.encode(replace(SPEC, image=tag), pb.EpisodeSpec)
    request = pb.SubmitEpisodesRequest(submits=[pb.SubmitEpisodeRequest(spec=spec) for _ in range(64)])
    reply = service.SubmitEpisodes(request, None)  # type: ignore[arg-type]  # unused on success
    assert {e.spec.image for e in reply.episodes} == {f"127.0.0.1:5000/team/harness@{digest}"}
    asked = [c for n in ("node-1", "node-2") for c in loop.node(n).calls if c[0] == "resolve_image"]
    assert asked == [("resolve_image", tag)]
    service.SubmitEpisodes(request, None)  # type: ignore[arg-type]
    asked = [c for n in ("node-1", "node-2") for c in loop.node(n).calls if c[0] == "resolve_image"]
    assert len(asked) == 2, "the next call asks again: a tag may move between groups"


@pytest.mark.timeout(30)
def test_an_imported_image_is_pulled_on_every_node_and_its_name_pins_it(loop: Loop) -> None:
    tag, digest = "127.0.0.1:5000/stasis/tools:latest", "sha256:" + "f" * 64
    for name in ("node-1", "node-2"):
        loop.node(name).registry[tag] = digest
    heard: list[PullStatus] = []
    record = loop.control.images.import_image("tools", tag, "docker://tools:latest", heard.append)
    for name in ("node-1", "node-2"):
        assert [(p.phase, p.bytes_done) for p in heard if p.node == name] == [
            ("fetching", 0), ("fetching", 4096), ("done", 0),
        ], "each node's pull is heard as it goes, and its end"  # fmt: skip
    assert (
        record.reference == f"127.0.0.1:5000/stasis/tools@{digest}"
        and record.source == "docker://tools:latest"
    )
    assert all(loop.node(n).pulled == [record.reference] for n in ("node-1", "node-2"))
    assert loop.control.images.caching(record) == ["node-1", "node-2"]
    assert loop.control.images.pin("tools", "spec.image") == record.reference
    with pytest.raises(InvalidArgument, match=r"^name: 'Bad Name' is not an image name"):
        loop.control.images.import_image("Bad Name", tag, "")
    loop.node("node-2").fail["pull_image"] = SpecRefused("node-2", f"image {tag!r}: unauthorized")
    with pytest.raises(InvalidArgument, match=r"unauthorized"):
        loop.control.images.import_image("other", tag, "")
    assert [i.name for i in loop.store.images.all()] == ["tools"], "a failed import catalogues nothing"
    loop.control.images.remove("tools")
    with pytest.raises(NotFound, match=r"image 'tools' was not imported"):
        loop.control.images.remove("tools")
