"""How the CLI shows the nodes' pulls of an image: one redrawn line of bars on a terminal, event
lines otherwise (a phase change, or each further quarter of the bytes)."""

from __future__ import annotations

import time
from typing import Any

from orchestrator.domain import PullStatus

BAR_WIDTH = 20
REDRAW_S = 0.2


def human_size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f}{unit}" if unit == "B" else f"{size:.1f}{unit}"
        size /= 1024
    return f"{n}B"


def _state(p: PullStatus) -> str:
    if p.phase != "fetching":
        return p.phase
    if not p.bytes_total:
        return f"fetching {human_size(p.bytes_done)}"
    return f"fetching {100 * p.bytes_done // p.bytes_total}% of {human_size(p.bytes_total)}"


class PullBoard:
    """Feed it each `PullStatus`; `close()` ends a terminal's line."""

    def __init__(self, stream: Any, terminal: bool | None = None) -> None:
        self.stream = stream
        self.terminal = stream.isatty() if terminal is None else terminal
        self.nodes: dict[str, PullStatus] = {}
        self._quarters: dict[str, int] = {}
        self._drawn = 0.0

    def __call__(self, p: PullStatus) -> None:
        before = self.nodes.get(p.node)
        self.nodes[p.node] = p
        if self.terminal:
            if p.phase != "fetching" or time.monotonic() - self._drawn >= REDRAW_S:
                self._draw()
            return
        quarter = 4 * p.bytes_done // p.bytes_total if p.bytes_total else 0
        if before is None or before.phase != p.phase or quarter > self._quarters.get(p.node, 0):
            self._quarters[p.node] = quarter
            print(f"{p.node}: {_state(p)}", file=self.stream, flush=True)

    def _draw(self) -> None:
        self._drawn = time.monotonic()
        parts = []
        for node, p in sorted(self.nodes.items()):
            if p.phase == "fetching" and p.bytes_total:
                filled = BAR_WIDTH * p.bytes_done // p.bytes_total
                bar = "#" * filled + "-" * (BAR_WIDTH - filled)
                parts.append(f"{node} [{bar}] {human_size(p.bytes_done)}/{human_size(p.bytes_total)}")
            else:
                parts.append(f"{node} {_state(p)}")
        self.stream.write("\r\x1b[K" + "  ".join(parts))
        self.stream.flush()

    def close(self) -> None:
        if self.terminal and self.nodes:
            self._draw()
            self.stream.write("\n")
            self.stream.flush()
