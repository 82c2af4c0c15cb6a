"""Which bytes an episode runs: a spec's image pinned once, at submit, and the catalogue of
images imported under a name.

* A catalogue name becomes the pinned reference it was imported as.
* A name or digest that a node caches stays as it is.
* A registry reference is resolved by a ready node (the nodes hold the registry credentials),
  tag to manifest digest; the pinned reference is what the episode and its snapshots record.

A reference that cannot be resolved (unknown repository, refused credentials, an unreachable
registry) fails the submit with the registry's words and changes nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from orchestrator.control.node_agent import AgentRefused, ImageView, NodeAgents
from orchestrator.domain import (
    ImageRecord,
    InvalidArgument,
    NodeRecord,
    NodeState,
    PullStatus,
    TemporaryError,
    check_name,
    is_reference,
)
from orchestrator.state import StateStore


class Images:
    def __init__(self, store: StateStore, agents: NodeAgents) -> None:
        self.store = store
        self.agents = agents

    def _ready(self) -> list[NodeRecord]:
        return [n for n in self.store.nodes.all() if n.state == NodeState.READY]

    def pin(self, image: str, field: str) -> str:
        """The image as an episode records it; raises InvalidArgument naming `field`."""
        imported = self.store.images.get(image)
        if imported is not None:
            return imported.reference
        nodes = [n for n in self.store.nodes.all() if n.state != NodeState.LOST]
        if not is_reference(image):
            if nodes and not any(n.has_image(image) for n in nodes):
                known = sorted(
                    {
                        name
                        for n in nodes
                        for names in n.images.values()
                        for name in names
                        if not is_reference(name)
                    }
                    | {r.name for r in self.store.images.all()}
                )
                raise InvalidArgument(
                    field,
                    f"{image!r} is not cached on any node, not an imported image and not a registry "
                    f"reference (host/repo:tag); known images: {', '.join(known) or 'none'}",
                )
            return image
        return self._resolve(image, field)

    def _resolve(self, reference: str, field: str) -> str:
        problems = []
        for node in self._ready():
            try:
                return self.agents.get(node.name).resolve_image(reference)
            except AgentRefused as exc:
                raise InvalidArgument(field, str(exc)) from None
            except TemporaryError as exc:
                problems.append(str(exc))
        raise TemporaryError(
            f"{field}: no ready node could resolve {reference!r} now"
            + (f" ({'; '.join(problems)})" if problems else "; no node is ready"),
            delay=2,
        )

    # the catalogue -------------------------------------------------------------------------

    def import_image(
        self,
        name: str,
        reference: str,
        source: str,
        progress: Callable[[PullStatus], None] = lambda _: None,
    ) -> ImageRecord:
        """Pin `reference` and pull it on every ready node under `name`; then catalogue it.
        `progress` hears each node's pull as it goes (from the nodes' threads).

        A node that fails the pull fails the import with its error; the catalogue is unchanged."""
        check_name(name)
        if not is_reference(reference):
            raise InvalidArgument("reference", f"{reference!r} is not a registry reference (host/repo:tag)")
        pinned = self._resolve(reference, "reference")
        nodes = self._ready()
        if not nodes:
            raise TemporaryError("no node is ready to pull the image", delay=2)

        def pull(node: str) -> ImageView:
            view = self.agents.get(node).pull_image(pinned, name, progress)
            progress(PullStatus(node, "done"))
            return view

        # The nodes pull at once; each fetches only the layers it lacks.
        with ThreadPoolExecutor(max_workers=min(8, len(nodes)), thread_name_prefix="pull") as pool:
            pulls = [pool.submit(pull, n.name) for n in nodes]
        try:
            views = [p.result() for p in pulls]
        except AgentRefused as exc:
            raise InvalidArgument("reference", str(exc)) from None
        record = ImageRecord(
            name=name, reference=pinned, digest=views[0].digest, size_bytes=views[0].size_bytes,
            source=source or reference, created_at=time.time(),
        )  # fmt: skip
        self.store.images.put(record)
        for node, view in zip(nodes, views, strict=True):
            images = dict(self.store.nodes.get(node.name).images)
            images[view.digest] = sorted(set(images.get(view.digest, [])) | set(view.names))
            self.store.nodes.set_images(node.name, images)
        return record

    def remove(self, name: str) -> ImageRecord:
        """Take a name out of the catalogue. Episodes that already pinned it keep their bytes."""
        return self.store.images.delete(name)

    def caching(self, image: ImageRecord) -> list[str]:
        """The nodes whose cache holds the image."""
        return [
            n.name for n in self.store.nodes.all() if image.digest in n.images or n.has_image(image.reference)
        ]
