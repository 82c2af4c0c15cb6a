"""Images as the control plane sees them: what a spec's `image` names, and the catalogue of
images that `stasis image import` made.

An image is named one of three ways:
* a name cached on the nodes ('base', or one in the catalogue);
* a content digest, sha256:<hex>, of an image tree a node caches;
* a registry reference, host[:port]/repo:tag or host[:port]/repo@sha256:<hex>. Only references
  hold a '/', so they need no parser here; the nodes parse them and pull them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from orchestrator.domain.errors import InvalidArgument

_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,127}")


def is_reference(image: str) -> bool:
    """Whether a node can pull this image from a registry."""
    return "/" in image


def is_pinned(image: str) -> bool:
    """A registry reference by manifest digest: the same bytes for every run and every restore."""
    return is_reference(image) and "@sha256:" in image


def check_name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise InvalidArgument(
            "name", f"{name!r} is not an image name: lower-case letters, digits, '.', '_' and '-', up to 128"
        )
    return name


@dataclass(frozen=True)
class ImageRecord:
    """An image in the catalogue, by the name it was imported under."""

    name: str
    reference: str
    """Where nodes pull it from, pinned: host/repo@sha256:<manifest digest>."""
    digest: str
    """The content digest of its unpacked tree, as the nodes cache it."""
    size_bytes: int
    source: str
    """What it was imported from (a directory, an archive, docker://IMAGE)."""
    created_at: float


@dataclass(frozen=True)
class PullStatus:
    """How far one node's pull of an image has got: `waiting` for its cache, `fetching`
    (`bytes_done` of `bytes_total` blob bytes on the node; total 0 when unknown), `unpacking`,
    `done`."""

    node: str
    phase: str
    bytes_done: int = 0
    bytes_total: int = 0
