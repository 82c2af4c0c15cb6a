"""Submits that start from a snapshot: a set-up taken once, forked per batch.

The snapshot's processes restore as they were, so what a spec says of them (command, entrypoint,
environment, files, resources) cannot change; a submit may set only what is read around them:
labels (added to the snapshot's episode's), the reward, preemption and limits. An image, if
given, must be the one the snapshot ran.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from orchestrator.domain import Episode, EpisodeSpec, InvalidArgument, SnapshotRecord
from protos.shared import wire
from protos.stasis.v1 import stasis_pb2 as pb

_FIXED = ("command", "entrypoint", "has_entrypoint", "env", "files", "resources")
"""The spec fields a snapshot fixes: its processes restore as they were started."""


def spec_from_snapshot(
    request: pb.SubmitEpisodeRequest,
    record: SnapshotRecord,
    parent: Episode,
    pin: Callable[[str, str], str],
) -> EpisodeSpec:
    """The spec of an episode that starts from `record` (taken by `parent`): the parent's, with
    the request's labels, reward, preemption and limits; `pin` pins an image reference."""
    given = request.spec
    for name in _FIXED:
        if _is_set(given, name):
            raise InvalidArgument(
                f"spec.{name}", f"cannot be set when starting from snapshot {record.id}: its processes"
                " restore as they were started"
            )  # fmt: skip
    if given.image and pin(given.image, "spec.image") != parent.spec.image:
        raise InvalidArgument(
            "spec.image",
            f"is {given.image}, but snapshot {record.id} ran {parent.spec.image}; leave it empty",
        )
    overrides = wire.decode(given, EpisodeSpec)
    spec = parent.spec
    return replace(
        spec,
        labels={**spec.labels, **overrides.labels},
        reward=overrides.reward if given.HasField("reward") else spec.reward,
        preemption=overrides.preemption if given.HasField("preemption") else spec.preemption,
        limits=overrides.limits if given.HasField("limits") else spec.limits,
    ).validate()


def _is_set(message: pb.EpisodeSpec, name: str) -> bool:
    try:
        return message.HasField(name)
    except ValueError:  # a list, a map or a plain scalar: set if not empty
        return bool(getattr(message, name))
