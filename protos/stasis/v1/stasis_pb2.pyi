from protos.stasis.v1 import agent_pb2 as _agent_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EpisodeState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EPISODE_STATE_UNSPECIFIED: _ClassVar[EpisodeState]
    EPISODE_STATE_PENDING: _ClassVar[EpisodeState]
    EPISODE_STATE_RUNNING: _ClassVar[EpisodeState]
    EPISODE_STATE_CHECKPOINTING: _ClassVar[EpisodeState]
    EPISODE_STATE_PREEMPTED: _ClassVar[EpisodeState]
    EPISODE_STATE_RESTORING: _ClassVar[EpisodeState]
    EPISODE_STATE_SUCCEEDED: _ClassVar[EpisodeState]
    EPISODE_STATE_FAILED: _ClassVar[EpisodeState]
    EPISODE_STATE_CANCELLED: _ClassVar[EpisodeState]

class NodeState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NODE_STATE_UNSPECIFIED: _ClassVar[NodeState]
    NODE_STATE_READY: _ClassVar[NodeState]
    NODE_STATE_CORDONED: _ClassVar[NodeState]
    NODE_STATE_DRAINING: _ClassVar[NodeState]
    NODE_STATE_LOST: _ClassVar[NodeState]
EPISODE_STATE_UNSPECIFIED: EpisodeState
EPISODE_STATE_PENDING: EpisodeState
EPISODE_STATE_RUNNING: EpisodeState
EPISODE_STATE_CHECKPOINTING: EpisodeState
EPISODE_STATE_PREEMPTED: EpisodeState
EPISODE_STATE_RESTORING: EpisodeState
EPISODE_STATE_SUCCEEDED: EpisodeState
EPISODE_STATE_FAILED: EpisodeState
EPISODE_STATE_CANCELLED: EpisodeState
NODE_STATE_UNSPECIFIED: NodeState
NODE_STATE_READY: NodeState
NODE_STATE_CORDONED: NodeState
NODE_STATE_DRAINING: NodeState
NODE_STATE_LOST: NodeState

class EpisodeResources(_message.Message):
    __slots__ = ("cpus", "memory_mb", "disk_mb")
    CPUS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MB_FIELD_NUMBER: _ClassVar[int]
    DISK_MB_FIELD_NUMBER: _ClassVar[int]
    cpus: float
    memory_mb: int
    disk_mb: int
    def __init__(self, cpus: _Optional[float] = ..., memory_mb: _Optional[int] = ..., disk_mb: _Optional[int] = ...) -> None: ...

class Limits(_message.Message):
    __slots__ = ("max_wall_s",)
    MAX_WALL_S_FIELD_NUMBER: _ClassVar[int]
    max_wall_s: float
    def __init__(self, max_wall_s: _Optional[float] = ...) -> None: ...

class Preemption(_message.Message):
    __slots__ = ("time_slice_s", "priority", "autosave_s")
    TIME_SLICE_S_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    AUTOSAVE_S_FIELD_NUMBER: _ClassVar[int]
    time_slice_s: float
    priority: int
    autosave_s: float
    def __init__(self, time_slice_s: _Optional[float] = ..., priority: _Optional[int] = ..., autosave_s: _Optional[float] = ...) -> None: ...

class RewardSpec(_message.Message):
    __slots__ = ("command", "files", "image", "timeout_s", "output")
    class FilesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bytes
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    command: _containers.RepeatedScalarFieldContainer[str]
    files: _containers.ScalarMap[str, bytes]
    image: str
    timeout_s: float
    output: str
    def __init__(self, command: _Optional[_Iterable[str]] = ..., files: _Optional[_Mapping[str, bytes]] = ..., image: _Optional[str] = ..., timeout_s: _Optional[float] = ..., output: _Optional[str] = ...) -> None: ...

class EpisodeSpec(_message.Message):
    __slots__ = ("image", "command", "env", "files", "resources", "limits", "preemption", "labels", "reward", "entrypoint", "has_entrypoint", "egress")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class FilesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bytes
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    PREEMPTION_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    ENTRYPOINT_FIELD_NUMBER: _ClassVar[int]
    HAS_ENTRYPOINT_FIELD_NUMBER: _ClassVar[int]
    EGRESS_FIELD_NUMBER: _ClassVar[int]
    image: str
    command: _containers.RepeatedScalarFieldContainer[str]
    env: _containers.ScalarMap[str, str]
    files: _containers.ScalarMap[str, bytes]
    resources: EpisodeResources
    limits: Limits
    preemption: Preemption
    labels: _containers.ScalarMap[str, str]
    reward: RewardSpec
    entrypoint: _containers.RepeatedScalarFieldContainer[str]
    has_entrypoint: bool
    egress: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, image: _Optional[str] = ..., command: _Optional[_Iterable[str]] = ..., env: _Optional[_Mapping[str, str]] = ..., files: _Optional[_Mapping[str, bytes]] = ..., resources: _Optional[_Union[EpisodeResources, _Mapping]] = ..., limits: _Optional[_Union[Limits, _Mapping]] = ..., preemption: _Optional[_Union[Preemption, _Mapping]] = ..., labels: _Optional[_Mapping[str, str]] = ..., reward: _Optional[_Union[RewardSpec, _Mapping]] = ..., entrypoint: _Optional[_Iterable[str]] = ..., has_entrypoint: _Optional[bool] = ..., egress: _Optional[_Iterable[str]] = ...) -> None: ...

class Episode(_message.Message):
    __slots__ = ("id", "spec", "state", "reason", "node", "sandbox_id", "address", "snapshots", "last_snapshot_id", "has_reward", "reward", "has_exit_code", "exit_code", "submitted_at", "updated_at", "finished_at", "run_seconds", "runs", "held", "pinned_node", "group_id", "group_index", "forked_from", "fork_parent", "fork_index")
    ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOTS_FIELD_NUMBER: _ClassVar[int]
    LAST_SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    HAS_REWARD_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    HAS_EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    SUBMITTED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    RUN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    RUNS_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    PINNED_NODE_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_INDEX_FIELD_NUMBER: _ClassVar[int]
    FORKED_FROM_FIELD_NUMBER: _ClassVar[int]
    FORK_PARENT_FIELD_NUMBER: _ClassVar[int]
    FORK_INDEX_FIELD_NUMBER: _ClassVar[int]
    id: str
    spec: EpisodeSpec
    state: EpisodeState
    reason: str
    node: str
    sandbox_id: str
    address: str
    snapshots: int
    last_snapshot_id: str
    has_reward: bool
    reward: float
    has_exit_code: bool
    exit_code: int
    submitted_at: float
    updated_at: float
    finished_at: float
    run_seconds: float
    runs: int
    held: bool
    pinned_node: str
    group_id: str
    group_index: int
    forked_from: str
    fork_parent: str
    fork_index: int
    def __init__(self, id: _Optional[str] = ..., spec: _Optional[_Union[EpisodeSpec, _Mapping]] = ..., state: _Optional[_Union[EpisodeState, str]] = ..., reason: _Optional[str] = ..., node: _Optional[str] = ..., sandbox_id: _Optional[str] = ..., address: _Optional[str] = ..., snapshots: _Optional[int] = ..., last_snapshot_id: _Optional[str] = ..., has_reward: _Optional[bool] = ..., reward: _Optional[float] = ..., has_exit_code: _Optional[bool] = ..., exit_code: _Optional[int] = ..., submitted_at: _Optional[float] = ..., updated_at: _Optional[float] = ..., finished_at: _Optional[float] = ..., run_seconds: _Optional[float] = ..., runs: _Optional[int] = ..., held: _Optional[bool] = ..., pinned_node: _Optional[str] = ..., group_id: _Optional[str] = ..., group_index: _Optional[int] = ..., forked_from: _Optional[str] = ..., fork_parent: _Optional[str] = ..., fork_index: _Optional[int] = ...) -> None: ...

class EpisodeEvent(_message.Message):
    __slots__ = ("seq", "episode_id", "kind", "from_state", "to_state", "reason", "message", "node", "at", "actor")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    EPISODE_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    FROM_STATE_FIELD_NUMBER: _ClassVar[int]
    TO_STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    seq: int
    episode_id: str
    kind: str
    from_state: EpisodeState
    to_state: EpisodeState
    reason: str
    message: str
    node: str
    at: float
    actor: str
    def __init__(self, seq: _Optional[int] = ..., episode_id: _Optional[str] = ..., kind: _Optional[str] = ..., from_state: _Optional[_Union[EpisodeState, str]] = ..., to_state: _Optional[_Union[EpisodeState, str]] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ..., node: _Optional[str] = ..., at: _Optional[float] = ..., actor: _Optional[str] = ...) -> None: ...

class SubmitEpisodeRequest(_message.Message):
    __slots__ = ("spec", "request_id", "from_snapshot")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    spec: EpisodeSpec
    request_id: str
    from_snapshot: str
    def __init__(self, spec: _Optional[_Union[EpisodeSpec, _Mapping]] = ..., request_id: _Optional[str] = ..., from_snapshot: _Optional[str] = ...) -> None: ...

class EpisodeGroup(_message.Message):
    __slots__ = ("id", "task_id", "size", "max_staleness")
    ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_STALENESS_FIELD_NUMBER: _ClassVar[int]
    id: str
    task_id: str
    size: int
    max_staleness: int
    def __init__(self, id: _Optional[str] = ..., task_id: _Optional[str] = ..., size: _Optional[int] = ..., max_staleness: _Optional[int] = ...) -> None: ...

class SubmitEpisodesRequest(_message.Message):
    __slots__ = ("submits", "group")
    SUBMITS_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    submits: _containers.RepeatedCompositeFieldContainer[SubmitEpisodeRequest]
    group: EpisodeGroup
    def __init__(self, submits: _Optional[_Iterable[_Union[SubmitEpisodeRequest, _Mapping]]] = ..., group: _Optional[_Union[EpisodeGroup, _Mapping]] = ...) -> None: ...

class SubmitEpisodesResponse(_message.Message):
    __slots__ = ("episodes",)
    EPISODES_FIELD_NUMBER: _ClassVar[int]
    episodes: _containers.RepeatedCompositeFieldContainer[Episode]
    def __init__(self, episodes: _Optional[_Iterable[_Union[Episode, _Mapping]]] = ...) -> None: ...

class GetEpisodeRequest(_message.Message):
    __slots__ = ("episode_id",)
    EPISODE_ID_FIELD_NUMBER: _ClassVar[int]
    episode_id: str
    def __init__(self, episode_id: _Optional[str] = ...) -> None: ...

class ListEpisodesRequest(_message.Message):
    __slots__ = ("states", "node", "labels", "page_size", "page_token")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    STATES_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    states: _containers.RepeatedScalarFieldContainer[EpisodeState]
    node: str
    labels: _containers.ScalarMap[str, str]
    page_size: int
    page_token: str
    def __init__(self, states: _Optional[_Iterable[_Union[EpisodeState, str]]] = ..., node: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListEpisodesResponse(_message.Message):
    __slots__ = ("episodes", "next_page_token")
    EPISODES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    episodes: _containers.RepeatedCompositeFieldContainer[Episode]
    next_page_token: str
    def __init__(self, episodes: _Optional[_Iterable[_Union[Episode, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class WatchEpisodesRequest(_message.Message):
    __slots__ = ("episode_ids", "since_seq")
    EPISODE_IDS_FIELD_NUMBER: _ClassVar[int]
    SINCE_SEQ_FIELD_NUMBER: _ClassVar[int]
    episode_ids: _containers.RepeatedScalarFieldContainer[str]
    since_seq: int
    def __init__(self, episode_ids: _Optional[_Iterable[str]] = ..., since_seq: _Optional[int] = ...) -> None: ...

class ListEventsRequest(_message.Message):
    __slots__ = ("episode_id", "since_seq", "limit")
    EPISODE_ID_FIELD_NUMBER: _ClassVar[int]
    SINCE_SEQ_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    episode_id: str
    since_seq: int
    limit: int
    def __init__(self, episode_id: _Optional[str] = ..., since_seq: _Optional[int] = ..., limit: _Optional[int] = ...) -> None: ...

class ListEventsResponse(_message.Message):
    __slots__ = ("events",)
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[EpisodeEvent]
    def __init__(self, events: _Optional[_Iterable[_Union[EpisodeEvent, _Mapping]]] = ...) -> None: ...

class CancelEpisodeRequest(_message.Message):
    __slots__ = ("episode_id", "request_id")
    EPISODE_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    episode_id: str
    request_id: str
    def __init__(self, episode_id: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class PreemptEpisodeRequest(_message.Message):
    __slots__ = ("episode_id", "reason", "request_id")
    EPISODE_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    episode_id: str
    reason: str
    request_id: str
    def __init__(self, episode_id: _Optional[str] = ..., reason: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class ResumeEpisodeRequest(_message.Message):
    __slots__ = ("episode_id", "node", "request_id")
    EPISODE_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    episode_id: str
    node: str
    request_id: str
    def __init__(self, episode_id: _Optional[str] = ..., node: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class Snapshot(_message.Message):
    __slots__ = ("id", "episode_id", "parent_id", "sequence", "node", "reason", "created_at", "logical_bytes", "stored_bytes", "new_bytes", "trajectory_cursor", "timings_ms", "available", "manifest_digest", "forks")
    class TimingsMsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    EPISODE_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_ID_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    LOGICAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    STORED_BYTES_FIELD_NUMBER: _ClassVar[int]
    NEW_BYTES_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORY_CURSOR_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_MS_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_DIGEST_FIELD_NUMBER: _ClassVar[int]
    FORKS_FIELD_NUMBER: _ClassVar[int]
    id: str
    episode_id: str
    parent_id: str
    sequence: int
    node: str
    reason: str
    created_at: float
    logical_bytes: int
    stored_bytes: int
    new_bytes: int
    trajectory_cursor: str
    timings_ms: _containers.ScalarMap[str, float]
    available: bool
    manifest_digest: str
    forks: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, id: _Optional[str] = ..., episode_id: _Optional[str] = ..., parent_id: _Optional[str] = ..., sequence: _Optional[int] = ..., node: _Optional[str] = ..., reason: _Optional[str] = ..., created_at: _Optional[float] = ..., logical_bytes: _Optional[int] = ..., stored_bytes: _Optional[int] = ..., new_bytes: _Optional[int] = ..., trajectory_cursor: _Optional[str] = ..., timings_ms: _Optional[_Mapping[str, float]] = ..., available: _Optional[bool] = ..., manifest_digest: _Optional[str] = ..., forks: _Optional[_Iterable[str]] = ...) -> None: ...

class ListSnapshotsRequest(_message.Message):
    __slots__ = ("episode_id",)
    EPISODE_ID_FIELD_NUMBER: _ClassVar[int]
    episode_id: str
    def __init__(self, episode_id: _Optional[str] = ...) -> None: ...

class ForkEpisodeRequest(_message.Message):
    __slots__ = ("episode_id", "count", "snapshot_id", "now", "stop", "request_id", "labels", "group")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    EPISODE_ID_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    NOW_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    episode_id: str
    count: int
    snapshot_id: str
    now: bool
    stop: bool
    request_id: str
    labels: _containers.ScalarMap[str, str]
    group: EpisodeGroup
    def __init__(self, episode_id: _Optional[str] = ..., count: _Optional[int] = ..., snapshot_id: _Optional[str] = ..., now: _Optional[bool] = ..., stop: _Optional[bool] = ..., request_id: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., group: _Optional[_Union[EpisodeGroup, _Mapping]] = ...) -> None: ...

class ForkEpisodeResponse(_message.Message):
    __slots__ = ("snapshot_id", "children")
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    CHILDREN_FIELD_NUMBER: _ClassVar[int]
    snapshot_id: str
    children: _containers.RepeatedCompositeFieldContainer[Episode]
    def __init__(self, snapshot_id: _Optional[str] = ..., children: _Optional[_Iterable[_Union[Episode, _Mapping]]] = ...) -> None: ...

class ExportSnapshotRequest(_message.Message):
    __slots__ = ("snapshot_id",)
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    snapshot_id: str
    def __init__(self, snapshot_id: _Optional[str] = ...) -> None: ...

class ArchiveChunk(_message.Message):
    __slots__ = ("data",)
    DATA_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    def __init__(self, data: _Optional[bytes] = ...) -> None: ...

class ListSnapshotsResponse(_message.Message):
    __slots__ = ("snapshots",)
    SNAPSHOTS_FIELD_NUMBER: _ClassVar[int]
    snapshots: _containers.RepeatedCompositeFieldContainer[Snapshot]
    def __init__(self, snapshots: _Optional[_Iterable[_Union[Snapshot, _Mapping]]] = ...) -> None: ...

class Node(_message.Message):
    __slots__ = ("name", "address", "state", "backend", "slots", "slots_used", "memory_mb", "memory_used_mb", "images", "last_heartbeat", "episodes", "labels", "disk_mb", "disk_used_mb")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    SLOTS_USED_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MB_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_MB_FIELD_NUMBER: _ClassVar[int]
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    EPISODES_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    DISK_MB_FIELD_NUMBER: _ClassVar[int]
    DISK_USED_MB_FIELD_NUMBER: _ClassVar[int]
    name: str
    address: str
    state: NodeState
    backend: str
    slots: int
    slots_used: int
    memory_mb: int
    memory_used_mb: int
    images: _containers.RepeatedCompositeFieldContainer[_agent_pb2.Image]
    last_heartbeat: float
    episodes: _containers.RepeatedScalarFieldContainer[str]
    labels: _containers.ScalarMap[str, str]
    disk_mb: int
    disk_used_mb: int
    def __init__(self, name: _Optional[str] = ..., address: _Optional[str] = ..., state: _Optional[_Union[NodeState, str]] = ..., backend: _Optional[str] = ..., slots: _Optional[int] = ..., slots_used: _Optional[int] = ..., memory_mb: _Optional[int] = ..., memory_used_mb: _Optional[int] = ..., images: _Optional[_Iterable[_Union[_agent_pb2.Image, _Mapping]]] = ..., last_heartbeat: _Optional[float] = ..., episodes: _Optional[_Iterable[str]] = ..., labels: _Optional[_Mapping[str, str]] = ..., disk_mb: _Optional[int] = ..., disk_used_mb: _Optional[int] = ...) -> None: ...

class NamedImage(_message.Message):
    __slots__ = ("name", "reference", "digest", "size_bytes", "source", "created_at", "nodes")
    NAME_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    name: str
    reference: str
    digest: str
    size_bytes: int
    source: str
    created_at: float
    nodes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., reference: _Optional[str] = ..., digest: _Optional[str] = ..., size_bytes: _Optional[int] = ..., source: _Optional[str] = ..., created_at: _Optional[float] = ..., nodes: _Optional[_Iterable[str]] = ...) -> None: ...

class ImportNamedImageRequest(_message.Message):
    __slots__ = ("name", "reference", "source")
    NAME_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    name: str
    reference: str
    source: str
    def __init__(self, name: _Optional[str] = ..., reference: _Optional[str] = ..., source: _Optional[str] = ...) -> None: ...

class ImportProgress(_message.Message):
    __slots__ = ("node", "phase", "bytes_done", "bytes_total", "image")
    NODE_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    BYTES_DONE_FIELD_NUMBER: _ClassVar[int]
    BYTES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    node: str
    phase: str
    bytes_done: int
    bytes_total: int
    image: NamedImage
    def __init__(self, node: _Optional[str] = ..., phase: _Optional[str] = ..., bytes_done: _Optional[int] = ..., bytes_total: _Optional[int] = ..., image: _Optional[_Union[NamedImage, _Mapping]] = ...) -> None: ...

class ListImagesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListImagesResponse(_message.Message):
    __slots__ = ("images", "import_registry")
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    IMPORT_REGISTRY_FIELD_NUMBER: _ClassVar[int]
    images: _containers.RepeatedCompositeFieldContainer[NamedImage]
    import_registry: str
    def __init__(self, images: _Optional[_Iterable[_Union[NamedImage, _Mapping]]] = ..., import_registry: _Optional[str] = ...) -> None: ...

class RemoveImageRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class GetEpisodeLogRequest(_message.Message):
    __slots__ = ("episode_id", "run", "offset")
    EPISODE_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    episode_id: str
    run: int
    offset: int
    def __init__(self, episode_id: _Optional[str] = ..., run: _Optional[int] = ..., offset: _Optional[int] = ...) -> None: ...

class EpisodeLog(_message.Message):
    __slots__ = ("content", "next_offset", "complete")
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    content: bytes
    next_offset: int
    complete: bool
    def __init__(self, content: _Optional[bytes] = ..., next_offset: _Optional[int] = ..., complete: _Optional[bool] = ...) -> None: ...

class ListNodesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListNodesResponse(_message.Message):
    __slots__ = ("nodes",)
    NODES_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[Node]
    def __init__(self, nodes: _Optional[_Iterable[_Union[Node, _Mapping]]] = ...) -> None: ...

class DrainNodeRequest(_message.Message):
    __slots__ = ("node", "request_id")
    NODE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    node: str
    request_id: str
    def __init__(self, node: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class UncordonNodeRequest(_message.Message):
    __slots__ = ("node", "request_id")
    NODE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    node: str
    request_id: str
    def __init__(self, node: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class JoinClusterRequest(_message.Message):
    __slots__ = ("node", "csr_pem", "token")
    NODE_FIELD_NUMBER: _ClassVar[int]
    CSR_PEM_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    node: str
    csr_pem: bytes
    token: str
    def __init__(self, node: _Optional[str] = ..., csr_pem: _Optional[bytes] = ..., token: _Optional[str] = ...) -> None: ...

class JoinClusterResponse(_message.Message):
    __slots__ = ("certificate_pem", "ca_pem")
    CERTIFICATE_PEM_FIELD_NUMBER: _ClassVar[int]
    CA_PEM_FIELD_NUMBER: _ClassVar[int]
    certificate_pem: bytes
    ca_pem: bytes
    def __init__(self, certificate_pem: _Optional[bytes] = ..., ca_pem: _Optional[bytes] = ...) -> None: ...

class LeaveRequest(_message.Message):
    __slots__ = ("node",)
    NODE_FIELD_NUMBER: _ClassVar[int]
    node: str
    def __init__(self, node: _Optional[str] = ...) -> None: ...

class LeaveResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RegisterNodeRequest(_message.Message):
    __slots__ = ("info", "address", "sandboxes")
    INFO_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    SANDBOXES_FIELD_NUMBER: _ClassVar[int]
    info: _agent_pb2.NodeInfo
    address: str
    sandboxes: _containers.RepeatedCompositeFieldContainer[_agent_pb2.Sandbox]
    def __init__(self, info: _Optional[_Union[_agent_pb2.NodeInfo, _Mapping]] = ..., address: _Optional[str] = ..., sandboxes: _Optional[_Iterable[_Union[_agent_pb2.Sandbox, _Mapping]]] = ...) -> None: ...

class RegisterNodeResponse(_message.Message):
    __slots__ = ("heartbeat_interval_s",)
    HEARTBEAT_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    heartbeat_interval_s: float
    def __init__(self, heartbeat_interval_s: _Optional[float] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("node", "sandboxes", "images")
    NODE_FIELD_NUMBER: _ClassVar[int]
    SANDBOXES_FIELD_NUMBER: _ClassVar[int]
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    node: str
    sandboxes: _containers.RepeatedCompositeFieldContainer[_agent_pb2.Sandbox]
    images: _containers.RepeatedCompositeFieldContainer[_agent_pb2.Image]
    def __init__(self, node: _Optional[str] = ..., sandboxes: _Optional[_Iterable[_Union[_agent_pb2.Sandbox, _Mapping]]] = ..., images: _Optional[_Iterable[_Union[_agent_pb2.Image, _Mapping]]] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("known",)
    KNOWN_FIELD_NUMBER: _ClassVar[int]
    known: bool
    def __init__(self, known: _Optional[bool] = ...) -> None: ...

class Sampling(_message.Message):
    __slots__ = ("temperature", "top_p", "top_k", "max_tokens")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_p: float
    top_k: int
    max_tokens: int
    def __init__(self, temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., max_tokens: _Optional[int] = ...) -> None: ...

class Turn(_message.Message):
    __slots__ = ("id", "index", "branch", "replayed", "replays", "abandoned", "token_ids", "logprobs", "policy_version", "parent_id", "run", "created_at", "prompt_tokens", "prompt_token_ids", "finish_reason", "mode", "prefix_exact", "prefix_checked", "common_prefix", "break_reason", "sampling", "logprobs_exact", "edge", "edge_parent", "delivery_uncertain", "shared", "episode_id")
    ID_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    BRANCH_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    REPLAYS_FIELD_NUMBER: _ClassVar[int]
    ABANDONED_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    PARENT_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    PREFIX_EXACT_FIELD_NUMBER: _ClassVar[int]
    PREFIX_CHECKED_FIELD_NUMBER: _ClassVar[int]
    COMMON_PREFIX_FIELD_NUMBER: _ClassVar[int]
    BREAK_REASON_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_EXACT_FIELD_NUMBER: _ClassVar[int]
    EDGE_FIELD_NUMBER: _ClassVar[int]
    EDGE_PARENT_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_UNCERTAIN_FIELD_NUMBER: _ClassVar[int]
    SHARED_FIELD_NUMBER: _ClassVar[int]
    EPISODE_ID_FIELD_NUMBER: _ClassVar[int]
    id: int
    index: int
    branch: int
    replayed: bool
    replays: int
    abandoned: bool
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    policy_version: str
    parent_id: int
    run: int
    created_at: float
    prompt_tokens: int
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    finish_reason: str
    mode: str
    prefix_exact: bool
    prefix_checked: bool
    common_prefix: int
    break_reason: str
    sampling: Sampling
    logprobs_exact: bool
    edge: str
    edge_parent: int
    delivery_uncertain: bool
    shared: bool
    episode_id: str
    def __init__(self, id: _Optional[int] = ..., index: _Optional[int] = ..., branch: _Optional[int] = ..., replayed: _Optional[bool] = ..., replays: _Optional[int] = ..., abandoned: _Optional[bool] = ..., token_ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[float]] = ..., policy_version: _Optional[str] = ..., parent_id: _Optional[int] = ..., run: _Optional[int] = ..., created_at: _Optional[float] = ..., prompt_tokens: _Optional[int] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., finish_reason: _Optional[str] = ..., mode: _Optional[str] = ..., prefix_exact: _Optional[bool] = ..., prefix_checked: _Optional[bool] = ..., common_prefix: _Optional[int] = ..., break_reason: _Optional[str] = ..., sampling: _Optional[_Union[Sampling, _Mapping]] = ..., logprobs_exact: _Optional[bool] = ..., edge: _Optional[str] = ..., edge_parent: _Optional[int] = ..., delivery_uncertain: _Optional[bool] = ..., shared: _Optional[bool] = ..., episode_id: _Optional[str] = ...) -> None: ...

class Sample(_message.Message):
    __slots__ = ("token_ids", "loss_mask", "logprobs", "policy_versions", "turn_ids", "branch", "sampling", "logprobs_exact", "published_version", "staleness", "staleness_known")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOSS_MASK_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    TURN_IDS_FIELD_NUMBER: _ClassVar[int]
    BRANCH_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_EXACT_FIELD_NUMBER: _ClassVar[int]
    PUBLISHED_VERSION_FIELD_NUMBER: _ClassVar[int]
    STALENESS_FIELD_NUMBER: _ClassVar[int]
    STALENESS_KNOWN_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    loss_mask: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    policy_versions: _containers.RepeatedScalarFieldContainer[str]
    turn_ids: _containers.RepeatedScalarFieldContainer[int]
    branch: int
    sampling: Sampling
    logprobs_exact: bool
    published_version: int
    staleness: _containers.RepeatedScalarFieldContainer[int]
    staleness_known: _containers.RepeatedScalarFieldContainer[bool]
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., loss_mask: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[float]] = ..., policy_versions: _Optional[_Iterable[str]] = ..., turn_ids: _Optional[_Iterable[int]] = ..., branch: _Optional[int] = ..., sampling: _Optional[_Union[Sampling, _Mapping]] = ..., logprobs_exact: _Optional[bool] = ..., published_version: _Optional[int] = ..., staleness: _Optional[_Iterable[int]] = ..., staleness_known: _Optional[_Iterable[bool]] = ...) -> None: ...

class TrajectoryBranch(_message.Message):
    __slots__ = ("id", "abandoned", "policy_versions", "turns", "edge")
    ID_FIELD_NUMBER: _ClassVar[int]
    ABANDONED_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    TURNS_FIELD_NUMBER: _ClassVar[int]
    EDGE_FIELD_NUMBER: _ClassVar[int]
    id: int
    abandoned: bool
    policy_versions: _containers.RepeatedScalarFieldContainer[str]
    turns: _containers.RepeatedCompositeFieldContainer[Turn]
    edge: str
    def __init__(self, id: _Optional[int] = ..., abandoned: _Optional[bool] = ..., policy_versions: _Optional[_Iterable[str]] = ..., turns: _Optional[_Iterable[_Union[Turn, _Mapping]]] = ..., edge: _Optional[str] = ...) -> None: ...

class Trajectory(_message.Message):
    __slots__ = ("episode_id", "state", "has_reward", "reward", "verifier_log", "main", "branches", "labels", "seq", "samples", "prompt_breaks", "group_id", "group_index", "group", "reward_metrics")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class RewardMetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    EPISODE_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    HAS_REWARD_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    VERIFIER_LOG_FIELD_NUMBER: _ClassVar[int]
    MAIN_FIELD_NUMBER: _ClassVar[int]
    BRANCHES_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    PROMPT_BREAKS_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_INDEX_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    REWARD_METRICS_FIELD_NUMBER: _ClassVar[int]
    episode_id: str
    state: EpisodeState
    has_reward: bool
    reward: float
    verifier_log: str
    main: TrajectoryBranch
    branches: _containers.RepeatedCompositeFieldContainer[TrajectoryBranch]
    labels: _containers.ScalarMap[str, str]
    seq: int
    samples: _containers.RepeatedCompositeFieldContainer[Sample]
    prompt_breaks: int
    group_id: str
    group_index: int
    group: GroupResult
    reward_metrics: _containers.ScalarMap[str, float]
    def __init__(self, episode_id: _Optional[str] = ..., state: _Optional[_Union[EpisodeState, str]] = ..., has_reward: _Optional[bool] = ..., reward: _Optional[float] = ..., verifier_log: _Optional[str] = ..., main: _Optional[_Union[TrajectoryBranch, _Mapping]] = ..., branches: _Optional[_Iterable[_Union[TrajectoryBranch, _Mapping]]] = ..., labels: _Optional[_Mapping[str, str]] = ..., seq: _Optional[int] = ..., samples: _Optional[_Iterable[_Union[Sample, _Mapping]]] = ..., prompt_breaks: _Optional[int] = ..., group_id: _Optional[str] = ..., group_index: _Optional[int] = ..., group: _Optional[_Union[GroupResult, _Mapping]] = ..., reward_metrics: _Optional[_Mapping[str, float]] = ...) -> None: ...

class GroupMember(_message.Message):
    __slots__ = ("index", "episode_id", "state", "reason", "has_reward", "reward")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    EPISODE_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    HAS_REWARD_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    index: int
    episode_id: str
    state: EpisodeState
    reason: str
    has_reward: bool
    reward: float
    def __init__(self, index: _Optional[int] = ..., episode_id: _Optional[str] = ..., state: _Optional[_Union[EpisodeState, str]] = ..., reason: _Optional[str] = ..., has_reward: _Optional[bool] = ..., reward: _Optional[float] = ...) -> None: ...

class GroupResult(_message.Message):
    __slots__ = ("id", "task_id", "size", "max_staleness", "final", "complete", "broken", "broken_by", "problem", "members", "created_at")
    ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_STALENESS_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    BROKEN_FIELD_NUMBER: _ClassVar[int]
    BROKEN_BY_FIELD_NUMBER: _ClassVar[int]
    PROBLEM_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    id: str
    task_id: str
    size: int
    max_staleness: int
    final: int
    complete: bool
    broken: bool
    broken_by: GroupMember
    problem: str
    members: _containers.RepeatedCompositeFieldContainer[GroupMember]
    created_at: float
    def __init__(self, id: _Optional[str] = ..., task_id: _Optional[str] = ..., size: _Optional[int] = ..., max_staleness: _Optional[int] = ..., final: _Optional[int] = ..., complete: _Optional[bool] = ..., broken: _Optional[bool] = ..., broken_by: _Optional[_Union[GroupMember, _Mapping]] = ..., problem: _Optional[str] = ..., members: _Optional[_Iterable[_Union[GroupMember, _Mapping]]] = ..., created_at: _Optional[float] = ...) -> None: ...

class ListGroupsRequest(_message.Message):
    __slots__ = ("group_id",)
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    def __init__(self, group_id: _Optional[str] = ...) -> None: ...

class ListGroupsResponse(_message.Message):
    __slots__ = ("groups",)
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    groups: _containers.RepeatedCompositeFieldContainer[GroupResult]
    def __init__(self, groups: _Optional[_Iterable[_Union[GroupResult, _Mapping]]] = ...) -> None: ...

class PublishPolicyRequest(_message.Message):
    __slots__ = ("version", "request_id")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    version: int
    request_id: str
    def __init__(self, version: _Optional[int] = ..., request_id: _Optional[str] = ...) -> None: ...

class PolicyVersion(_message.Message):
    __slots__ = ("version", "published_at")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PUBLISHED_AT_FIELD_NUMBER: _ClassVar[int]
    version: int
    published_at: float
    def __init__(self, version: _Optional[int] = ..., published_at: _Optional[float] = ...) -> None: ...

class GetTrajectoryRequest(_message.Message):
    __slots__ = ("episode_id", "include_branches")
    EPISODE_ID_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_BRANCHES_FIELD_NUMBER: _ClassVar[int]
    episode_id: str
    include_branches: bool
    def __init__(self, episode_id: _Optional[str] = ..., include_branches: _Optional[bool] = ...) -> None: ...

class StreamTrajectoriesRequest(_message.Message):
    __slots__ = ("labels", "since_seq", "include_branches", "include_groups")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    LABELS_FIELD_NUMBER: _ClassVar[int]
    SINCE_SEQ_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_BRANCHES_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_GROUPS_FIELD_NUMBER: _ClassVar[int]
    labels: _containers.ScalarMap[str, str]
    since_seq: int
    include_branches: bool
    include_groups: bool
    def __init__(self, labels: _Optional[_Mapping[str, str]] = ..., since_seq: _Optional[int] = ..., include_branches: _Optional[bool] = ..., include_groups: _Optional[bool] = ...) -> None: ...
