"""The typed client for trainer code and the CLI, and the spec-file loader.

Owns everything a caller of the public API needs; no protobuf or gRPC type leaks out of it.
Imports the domain and the wire codec only, never the service, the control loop or the state.
"""

from orchestrator.client.client import DEFAULT_ADDR, StasisClient
from orchestrator.client.config import Context, config_path, load_context, merge_context
from orchestrator.client.records import (
    BranchInfo,
    EpisodeInfo,
    EventInfo,
    GroupInfo,
    GroupMemberInfo,
    ImageInfo,
    NamedImageInfo,
    NodeInfo,
    PolicyVersionInfo,
    SampleInfo,
    SamplingInfo,
    SnapshotInfo,
    TrajectoryInfo,
    TurnInfo,
)
from orchestrator.client.specfile import load_spec_file, spec_from_mapping

__all__ = [
    "DEFAULT_ADDR",
    "BranchInfo",
    "Context",
    "EpisodeInfo",
    "EventInfo",
    "GroupInfo",
    "GroupMemberInfo",
    "ImageInfo",
    "NamedImageInfo",
    "NodeInfo",
    "PolicyVersionInfo",
    "SampleInfo",
    "SamplingInfo",
    "SnapshotInfo",
    "StasisClient",
    "TrajectoryInfo",
    "TurnInfo",
    "config_path",
    "load_context",
    "load_spec_file",
    "merge_context",
    "spec_from_mapping",
]
