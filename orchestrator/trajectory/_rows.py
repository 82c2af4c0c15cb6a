"""A turn's row in the ledger's `turns` table, and the turn read back from it.

Two things keep a row small. A request body over `PACK_OVER` is stored zstd-compressed
(`packed`). A prompt that extends its parent's tokens is stored as what it adds to them
(`prompt_base` says how many leading tokens it takes from the parent); reading it rebuilds the
whole prompt from the parent's prompt plus sampled ids, which `TurnRows` keeps for recently
recorded or read turns, so that a long conversation's next turn is not rebuilt row by row.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import zstandard

from orchestrator.state.sql import Connection
from orchestrator.trajectory import schema
from orchestrator.trajectory.turns import Lineage, Sampling, Turn

BUT_BODIES = ", ".join(
    c for c in schema.TURN_COLUMNS if c not in ("request_raw", "response", "delivered", "request", "answer")
)
"""A turn's columns but its bodies (megabytes for a long conversation): what finding one needs."""

PACK_OVER = 16 << 10
"""Request bodies longer than this are stored zstd-compressed: a long conversation's body is
mostly the same text turn after turn, and stored whole it would be most of what each commit
writes."""
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def packed(body: bytes) -> bytes:
    return zstandard.ZstdCompressor(level=1).compress(body) if len(body) > PACK_OVER else body


def unpacked(stored: bytes) -> bytes:
    """A stored body as it arrived: a zstd frame (its magic tells; no harness body, JSON, begins
    with it) is decompressed."""
    return zstandard.ZstdDecompressor().decompress(stored) if stored.startswith(_ZSTD_MAGIC) else stored


class TurnRows:
    """Turns read from their rows, with the prompt plus sampled ids of recently recorded or read
    turns, which the next turns of their episodes are built on, up to `budget` tokens in all
    (least recently used go first)."""

    def __init__(self, budget: int = 16 << 20) -> None:
        self._budget = budget
        self._held = 0
        self._by_turn: OrderedDict[int, list[int]] = OrderedDict()
        self._lock = threading.Lock()

    def turn(self, db: Connection, r: Any, prompts: Mapping[int, list[int]] | None = None) -> Turn:
        """A turn from its row; its prompt is rebuilt from its parent's tokens where it stores only
        what they do not hold (`prompts`: tokens of the turns read with it)."""
        keys = r.keys()
        base, tail = r["prompt_base"], json.loads(r["prompt_token_ids"])
        if base:
            parent = (prompts or {}).get(r["parent_id"])
            if parent is None:
                parent = self.sequence(db, r["parent_id"])
            tail = parent[:base] + tail
        return Turn(
            id=r["id"],
            episode_id=r["episode_id"],
            parent_id=r["parent_id"],
            branch=r["branch"],
            run=r["run"],
            kind=r["kind"],
            request_raw=unpacked(bytes(r["request_raw"])) if "request_raw" in keys else b"",
            response=bytes(r["response"]) if "response" in keys else b"",
            protocol=r["protocol"],
            delivered=bytes(r["delivered"]) if "delivered" in keys else b"",
            delivered_run=r["delivered_run"],
            delivered_at=r["delivered_at"],
            token_ids=json.loads(r["token_ids"]),
            logprobs=json.loads(r["logprobs"]),
            prompt_token_ids=tail,
            policy_version=r["policy_version"],
            abandoned=bool(r["abandoned"]),
            replays=r["replays"],
            created_at=r["created_at"],
            after_len=r["after_len"],
            mode=r["mode"],
            lineage=Lineage(
                r["parent_id"],
                None if r["prefix_exact"] is None else bool(r["prefix_exact"]),
                r["common_prefix"],
                r["break_reason"],
            ),
            finish_reason=r["finish_reason"],
            sampling=Sampling(**json.loads(r["sampling"])),
            logprobs_mode=r["logprobs_mode"],
            tools_key=r["tools_key"],
            upstream_ms=r["upstream_ms"],
            sending_run=r["sending_run"],
            sending_at=r["sending_at"],
            edge=r["edge"],
            edge_parent=r["edge_parent"],
        )

    def sequence(self, db: Connection, turn_id: int) -> list[int]:
        """A turn's prompt ids plus its sampled ids: from the cache, or rebuilt from its row and
        those of the ancestors it takes its prompt from."""
        chain: list[Any] = []
        seq = self._get(turn_id)
        at = turn_id
        while seq is None:
            row = db.execute(
                "SELECT id, parent_id, prompt_base, prompt_token_ids, token_ids FROM turns WHERE id = ?",
                (at,),
            ).fetchone()
            chain.append(row)
            if not row["prompt_base"]:
                seq = []
            else:
                at = row["parent_id"]
                seq = self._get(at)
        for row in reversed(chain):
            tail, sampled = json.loads(row["prompt_token_ids"]), json.loads(row["token_ids"])
            seq = seq[: row["prompt_base"]] + tail + sampled
            self.hold(row["id"], seq)
        return seq

    def hold(self, turn_id: int, seq: list[int]) -> None:
        """Keep a turn's prompt plus sampled ids for the turns that will be built on it."""
        with self._lock:
            old = self._by_turn.pop(turn_id, None)
            self._held += len(seq) - (len(old) if old is not None else 0)
            self._by_turn[turn_id] = seq
            while self._held > self._budget and len(self._by_turn) > 1:
                _, dropped = self._by_turn.popitem(last=False)
                self._held -= len(dropped)

    def _get(self, turn_id: int) -> list[int] | None:
        with self._lock:
            seq = self._by_turn.get(turn_id)
            if seq is not None:
                self._by_turn.move_to_end(turn_id)
            return seq
