"""S3 backend failure handling against a real moto server: transient errors retried, then translated."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from snapshots import SnapshotStore, StoreRejected, StoreUnavailable
from tests.s3server import MotoServer
from tests.snapshots.conftest import fast_settings, make_meta, make_tree


@pytest.mark.timeout(60)
def test_unreachable_endpoint_is_unavailable_after_retries(moto_server: MotoServer, scratch: Path) -> None:
    server = MotoServer()
    server.create_bucket("flaky")
    store = SnapshotStore(fast_settings(f"s3://flaky/p?endpoint={server.endpoint}"))
    try:
        tree = make_tree(scratch / "tree")
        store.put(tree, make_meta("s1"))
        server.stop()
        started = time.monotonic()
        with pytest.raises(StoreUnavailable) as caught:
            store.manifest("s1")
        assert time.monotonic() - started >= 0.05, "retried with backoff before giving up"
        assert "flaky" in str(caught.value) and caught.value.key == "snapshots/s1.json"
    finally:
        store.close()
        server.stop()


@pytest.mark.timeout(60)
def test_an_endpoint_that_ignores_conditional_create_is_refused_before_anything_is_written(
    moto_server: MotoServer, scratch: Path
) -> None:
    """A put there could publish over another writer's manifest of the same snapshot id."""
    import boto3

    server = MotoServer(honours_if_none_match=False)
    try:
        server.create_bucket("careless")
        store = SnapshotStore(fast_settings(f"s3://careless/p?endpoint={server.endpoint}"))
        with store, pytest.raises(StoreRejected, match="If-None-Match") as caught:
            store.put(make_tree(scratch / "tree"), make_meta("s1"))
        assert server.endpoint in str(caught.value)
        client = boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1")
        left = client.list_objects_v2(Bucket="careless").get("Contents", [])
        client.close()
        assert left == [], "neither the probe nor any of the snapshot is left behind"
    finally:
        server.stop()


@pytest.mark.timeout(60)
def test_missing_bucket_is_rejected_not_retried(moto_server: MotoServer, scratch: Path) -> None:
    url = f"s3://no-such-bucket?endpoint={moto_server.endpoint}"
    with SnapshotStore(fast_settings(url)) as store, pytest.raises(StoreRejected, match="NoSuchBucket"):
        store.put(make_tree(scratch / "tree"), make_meta("s1"))


@pytest.mark.timeout(60)
def test_s3_layout_and_dedup_across_stores(moto_server: MotoServer, scratch: Path) -> None:
    import boto3

    moto_server.create_bucket("layout")
    url = f"s3://layout/team/snaps?endpoint={moto_server.endpoint}&region=us-east-1"
    tree = make_tree(scratch / "tree")
    with SnapshotStore(fast_settings(url)) as store:
        first = store.put(tree, make_meta("s1", episode_id="ep-1"))
    with SnapshotStore(fast_settings(url)) as store:
        second = store.put(tree, make_meta("s2", episode_id="ep-2"))
        assert second.sizes.new_bytes == 0 and second.sizes.stored_bytes == first.sizes.stored_bytes
        assert store.verify().ok
    client = boto3.client("s3", endpoint_url=moto_server.endpoint, region_name="us-east-1")
    keys = [o["Key"] for o in client.list_objects_v2(Bucket="layout")["Contents"]]
    client.close()
    assert all(k.startswith("team/snaps/") for k in keys)
    assert {
        "team/snaps/snapshots/s1.json",
        "team/snaps/episodes/ep-1/s1",
        "team/snaps/episodes/ep-2/s2",
    } <= set(keys)
    assert not [k for k in keys if k.startswith("team/snaps/locks/")], "locks are released"
    assert not [k for k in keys if k.startswith("team/snaps/probes/")], "the store's probe is removed"


@pytest.mark.timeout(60)
def test_s3_gc_and_corruption_detection(moto_server: MotoServer, scratch: Path) -> None:
    import boto3

    from snapshots import RetentionPolicy, SnapshotCorrupt

    moto_server.create_bucket("gc-test")
    url = f"s3://gc-test/p?endpoint={moto_server.endpoint}"
    client = boto3.client("s3", endpoint_url=moto_server.endpoint, region_name="us-east-1")

    def pack_keys() -> set[str]:
        pages = client.get_paginator("list_objects_v2").paginate(Bucket="gc-test", Prefix="p/packs/")
        return {o["Key"] for page in pages for o in page.get("Contents", ())}

    try:
        with SnapshotStore(fast_settings(url)) as store:
            for episode in ("live", "ended"):
                parent = None
                for seq in (1, 2, 3):
                    tree = make_tree(scratch / f"{episode}-{seq}")
                    store.put(
                        tree, make_meta(f"{episode}-{seq}", episode_id=episode, seq=seq, parent_id=parent)
                    )
                    parent = f"{episode}-{seq}"
            report = store.gc(RetentionPolicy(keep_last=1), ended_episodes={"ended"})
            assert sorted(report.deleted_snapshots) == ["ended-1", "ended-2", "ended-3", "live-1", "live-2"]
            assert report.deleted_chunks > 0
            live = {r.pack for e in store.manifest("live-3").files() for r in e.chunks}
            assert pack_keys() == {f"p/packs/{p}.{kind}" for p in live for kind in ("pack", "idx")}
            assert [h.snapshot_id for h in store.history("live")] == ["live-3"]
            assert store.verify().ok

            victim = store.manifest("live-3").files()[-1]
            ref = victim.chunks[0]
            key = f"p/packs/{ref.pack}.pack"
            blob = bytearray(client.get_object(Bucket="gc-test", Key=key)["Body"].read())
            blob[ref.offset : ref.offset + ref.stored_length] = b"x" * ref.stored_length  # not a zstd frame
            client.put_object(Bucket="gc-test", Key=key, Body=bytes(blob))
            problems = store.verify().problems
            assert [(p.snapshot_id, p.path, p.chunk) for p in problems] == [
                ("live-3", victim.path, victim.chunks[0].hash)
            ]
            with pytest.raises(SnapshotCorrupt, match=victim.chunks[0].hash):
                store.fetch("live-3", scratch / "out")
    finally:
        client.close()
