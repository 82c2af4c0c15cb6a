"""Object keys of the store layout (documented in docs/snapshot-format.md)."""

from __future__ import annotations

MANIFEST_PREFIX = "snapshots/"
EPISODE_PREFIX = "episodes/"
PACK_PREFIX = "packs/"
PROBE_PREFIX = "probes/"


def manifest_key(snapshot_id: str) -> str:
    """Key of a snapshot's manifest; its presence is what makes the snapshot exist."""
    return f"{MANIFEST_PREFIX}{snapshot_id}.json"


def manifest_id(key: str) -> str | None:
    """The snapshot id a manifest key names, or None for any other key."""
    if key.startswith(MANIFEST_PREFIX) and key.endswith(".json") and key.count("/") == 1:
        return key[len(MANIFEST_PREFIX) : -len(".json")]
    return None


def episode_key(episode_id: str, snapshot_id: str) -> str:
    """Key of the empty marker that lists a snapshot under its episode."""
    return f"{EPISODE_PREFIX}{episode_id}/{snapshot_id}"


def split_episode_key(key: str) -> tuple[str, str] | None:
    """(episode id, snapshot id) of a marker key, or None for any other key."""
    parts = key.split("/")
    if len(parts) == 3 and parts[0] + "/" == EPISODE_PREFIX and parts[1] and parts[2]:
        return parts[1], parts[2]
    return None


def pack_key(pack_id: str) -> str:
    """Key of a pack: stored chunks, one after another."""
    return f"{PACK_PREFIX}{pack_id}.pack"


def pack_index_key(pack_id: str) -> str:
    """Key of a pack's index: which chunk lies where in it; written after the pack."""
    return f"{PACK_PREFIX}{pack_id}.idx"


def split_pack_key(key: str) -> tuple[str, str] | None:
    """(pack id, "pack" or "idx") of a pack or index key, or None for any other key."""
    if not key.startswith(PACK_PREFIX) or key.count("/") != 1:
        return None
    pack_id, _, kind = key[len(PACK_PREFIX) :].rpartition(".")
    return (pack_id, kind) if pack_id and kind in ("pack", "idx") else None


def probe_key(name: str) -> str:
    """Key of a short-lived object with which the store tests what its backend promises."""
    return f"{PROBE_PREFIX}{name}"
