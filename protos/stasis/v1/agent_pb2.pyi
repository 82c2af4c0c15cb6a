from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SandboxState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SANDBOX_STATE_UNSPECIFIED: _ClassVar[SandboxState]
    SANDBOX_STATE_RUNNING: _ClassVar[SandboxState]
    SANDBOX_STATE_PAUSED: _ClassVar[SandboxState]
    SANDBOX_STATE_EXITED: _ClassVar[SandboxState]
    SANDBOX_STATE_UNKNOWN: _ClassVar[SandboxState]
SANDBOX_STATE_UNSPECIFIED: SandboxState
SANDBOX_STATE_RUNNING: SandboxState
SANDBOX_STATE_PAUSED: SandboxState
SANDBOX_STATE_EXITED: SandboxState
SANDBOX_STATE_UNKNOWN: SandboxState

class RunVerifierRequest(_message.Message):
    __slots__ = ("sandbox_id", "command", "files", "image", "timeout_s")
    class FilesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bytes
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    command: _containers.RepeatedScalarFieldContainer[str]
    files: _containers.ScalarMap[str, bytes]
    image: str
    timeout_s: float
    def __init__(self, sandbox_id: _Optional[str] = ..., command: _Optional[_Iterable[str]] = ..., files: _Optional[_Mapping[str, bytes]] = ..., image: _Optional[str] = ..., timeout_s: _Optional[float] = ...) -> None: ...

class VerifierResult(_message.Message):
    __slots__ = ("has_exit_code", "exit_code", "timed_out", "log", "duration_ms")
    HAS_EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    TIMED_OUT_FIELD_NUMBER: _ClassVar[int]
    LOG_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    has_exit_code: bool
    exit_code: int
    timed_out: bool
    log: bytes
    duration_ms: float
    def __init__(self, has_exit_code: _Optional[bool] = ..., exit_code: _Optional[int] = ..., timed_out: _Optional[bool] = ..., log: _Optional[bytes] = ..., duration_ms: _Optional[float] = ...) -> None: ...

class Resources(_message.Message):
    __slots__ = ("cpus", "memory_mb", "pids", "disk_mb", "inodes")
    CPUS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MB_FIELD_NUMBER: _ClassVar[int]
    PIDS_FIELD_NUMBER: _ClassVar[int]
    DISK_MB_FIELD_NUMBER: _ClassVar[int]
    INODES_FIELD_NUMBER: _ClassVar[int]
    cpus: float
    memory_mb: int
    pids: int
    disk_mb: int
    inodes: int
    def __init__(self, cpus: _Optional[float] = ..., memory_mb: _Optional[int] = ..., pids: _Optional[int] = ..., disk_mb: _Optional[int] = ..., inodes: _Optional[int] = ...) -> None: ...

class SandboxSpec(_message.Message):
    __slots__ = ("image", "command", "env", "cwd", "hostname", "address", "resources", "entrypoint", "has_entrypoint", "user", "egress")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    CWD_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    ENTRYPOINT_FIELD_NUMBER: _ClassVar[int]
    HAS_ENTRYPOINT_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    EGRESS_FIELD_NUMBER: _ClassVar[int]
    image: str
    command: _containers.RepeatedScalarFieldContainer[str]
    env: _containers.ScalarMap[str, str]
    cwd: str
    hostname: str
    address: str
    resources: Resources
    entrypoint: _containers.RepeatedScalarFieldContainer[str]
    has_entrypoint: bool
    user: str
    egress: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, image: _Optional[str] = ..., command: _Optional[_Iterable[str]] = ..., env: _Optional[_Mapping[str, str]] = ..., cwd: _Optional[str] = ..., hostname: _Optional[str] = ..., address: _Optional[str] = ..., resources: _Optional[_Union[Resources, _Mapping]] = ..., entrypoint: _Optional[_Iterable[str]] = ..., has_entrypoint: _Optional[bool] = ..., user: _Optional[str] = ..., egress: _Optional[_Iterable[str]] = ...) -> None: ...

class Sandbox(_message.Message):
    __slots__ = ("id", "node", "backend", "state", "spec", "image_digest", "pid", "has_exit_code", "exit_code", "created_at", "restored_from", "busy", "timings_ms", "log_start")
    class TimingsMsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    IMAGE_DIGEST_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    HAS_EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    RESTORED_FROM_FIELD_NUMBER: _ClassVar[int]
    BUSY_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_MS_FIELD_NUMBER: _ClassVar[int]
    LOG_START_FIELD_NUMBER: _ClassVar[int]
    id: str
    node: str
    backend: str
    state: SandboxState
    spec: SandboxSpec
    image_digest: str
    pid: int
    has_exit_code: bool
    exit_code: int
    created_at: float
    restored_from: str
    busy: bool
    timings_ms: _containers.ScalarMap[str, float]
    log_start: int
    def __init__(self, id: _Optional[str] = ..., node: _Optional[str] = ..., backend: _Optional[str] = ..., state: _Optional[_Union[SandboxState, str]] = ..., spec: _Optional[_Union[SandboxSpec, _Mapping]] = ..., image_digest: _Optional[str] = ..., pid: _Optional[int] = ..., has_exit_code: _Optional[bool] = ..., exit_code: _Optional[int] = ..., created_at: _Optional[float] = ..., restored_from: _Optional[str] = ..., busy: _Optional[bool] = ..., timings_ms: _Optional[_Mapping[str, float]] = ..., log_start: _Optional[int] = ...) -> None: ...

class CreateSandboxRequest(_message.Message):
    __slots__ = ("sandbox_id", "spec", "files")
    class FilesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bytes
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    spec: SandboxSpec
    files: _containers.ScalarMap[str, bytes]
    def __init__(self, sandbox_id: _Optional[str] = ..., spec: _Optional[_Union[SandboxSpec, _Mapping]] = ..., files: _Optional[_Mapping[str, bytes]] = ...) -> None: ...

class CheckpointRequest(_message.Message):
    __slots__ = ("sandbox_id", "directory", "leave_running", "snapshot")
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    DIRECTORY_FIELD_NUMBER: _ClassVar[int]
    LEAVE_RUNNING_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    directory: str
    leave_running: bool
    snapshot: SnapshotTarget
    def __init__(self, sandbox_id: _Optional[str] = ..., directory: _Optional[str] = ..., leave_running: _Optional[bool] = ..., snapshot: _Optional[_Union[SnapshotTarget, _Mapping]] = ...) -> None: ...

class SnapshotTarget(_message.Message):
    __slots__ = ("snapshot_id", "episode_id", "sequence", "parent_id", "reason", "trajectory_cursor")
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    EPISODE_ID_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    PARENT_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORY_CURSOR_FIELD_NUMBER: _ClassVar[int]
    snapshot_id: str
    episode_id: str
    sequence: int
    parent_id: str
    reason: str
    trajectory_cursor: str
    def __init__(self, snapshot_id: _Optional[str] = ..., episode_id: _Optional[str] = ..., sequence: _Optional[int] = ..., parent_id: _Optional[str] = ..., reason: _Optional[str] = ..., trajectory_cursor: _Optional[str] = ...) -> None: ...

class CheckpointResult(_message.Message):
    __slots__ = ("directory", "sandbox_id", "node", "backend", "image_digest", "criu_version", "criu_bytes", "layer_bytes", "created_at", "snapshot_id", "logical_bytes", "stored_bytes", "new_bytes", "timings_ms", "since_freeze_ms", "manifest_digest")
    class TimingsMsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    DIRECTORY_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    IMAGE_DIGEST_FIELD_NUMBER: _ClassVar[int]
    CRIU_VERSION_FIELD_NUMBER: _ClassVar[int]
    CRIU_BYTES_FIELD_NUMBER: _ClassVar[int]
    LAYER_BYTES_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    LOGICAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    STORED_BYTES_FIELD_NUMBER: _ClassVar[int]
    NEW_BYTES_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_MS_FIELD_NUMBER: _ClassVar[int]
    SINCE_FREEZE_MS_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_DIGEST_FIELD_NUMBER: _ClassVar[int]
    directory: str
    sandbox_id: str
    node: str
    backend: str
    image_digest: str
    criu_version: str
    criu_bytes: int
    layer_bytes: int
    created_at: float
    snapshot_id: str
    logical_bytes: int
    stored_bytes: int
    new_bytes: int
    timings_ms: _containers.ScalarMap[str, float]
    since_freeze_ms: float
    manifest_digest: str
    def __init__(self, directory: _Optional[str] = ..., sandbox_id: _Optional[str] = ..., node: _Optional[str] = ..., backend: _Optional[str] = ..., image_digest: _Optional[str] = ..., criu_version: _Optional[str] = ..., criu_bytes: _Optional[int] = ..., layer_bytes: _Optional[int] = ..., created_at: _Optional[float] = ..., snapshot_id: _Optional[str] = ..., logical_bytes: _Optional[int] = ..., stored_bytes: _Optional[int] = ..., new_bytes: _Optional[int] = ..., timings_ms: _Optional[_Mapping[str, float]] = ..., since_freeze_ms: _Optional[float] = ..., manifest_digest: _Optional[str] = ...) -> None: ...

class RestoreRequest(_message.Message):
    __slots__ = ("sandbox_id", "directory", "image", "skip_verify", "snapshot_id", "manifest_digest", "address", "hostname", "fork", "egress")
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    DIRECTORY_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    SKIP_VERIFY_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_DIGEST_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    FORK_FIELD_NUMBER: _ClassVar[int]
    EGRESS_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    directory: str
    image: str
    skip_verify: bool
    snapshot_id: str
    manifest_digest: str
    address: str
    hostname: str
    fork: ForkMark
    egress: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, sandbox_id: _Optional[str] = ..., directory: _Optional[str] = ..., image: _Optional[str] = ..., skip_verify: _Optional[bool] = ..., snapshot_id: _Optional[str] = ..., manifest_digest: _Optional[str] = ..., address: _Optional[str] = ..., hostname: _Optional[str] = ..., fork: _Optional[_Union[ForkMark, _Mapping]] = ..., egress: _Optional[_Iterable[str]] = ...) -> None: ...

class ForkMark(_message.Message):
    __slots__ = ("episode_id", "parent_episode_id", "snapshot_id", "index", "count")
    EPISODE_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_EPISODE_ID_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    episode_id: str
    parent_episode_id: str
    snapshot_id: str
    index: int
    count: int
    def __init__(self, episode_id: _Optional[str] = ..., parent_episode_id: _Optional[str] = ..., snapshot_id: _Optional[str] = ..., index: _Optional[int] = ..., count: _Optional[int] = ...) -> None: ...

class KillRequest(_message.Message):
    __slots__ = ("sandbox_id", "signal")
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    signal: int
    def __init__(self, sandbox_id: _Optional[str] = ..., signal: _Optional[int] = ...) -> None: ...

class DeleteSandboxRequest(_message.Message):
    __slots__ = ("sandbox_id",)
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    def __init__(self, sandbox_id: _Optional[str] = ...) -> None: ...

class DeleteSandboxResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetSandboxRequest(_message.Message):
    __slots__ = ("sandbox_id",)
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    def __init__(self, sandbox_id: _Optional[str] = ...) -> None: ...

class ListSandboxesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListSandboxesResponse(_message.Message):
    __slots__ = ("sandboxes",)
    SANDBOXES_FIELD_NUMBER: _ClassVar[int]
    sandboxes: _containers.RepeatedCompositeFieldContainer[Sandbox]
    def __init__(self, sandboxes: _Optional[_Iterable[_Union[Sandbox, _Mapping]]] = ...) -> None: ...

class GetHarnessLogRequest(_message.Message):
    __slots__ = ("sandbox_id", "tail_bytes", "from_offset", "offset", "snapshot_id")
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    TAIL_BYTES_FIELD_NUMBER: _ClassVar[int]
    FROM_OFFSET_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    tail_bytes: int
    from_offset: bool
    offset: int
    snapshot_id: str
    def __init__(self, sandbox_id: _Optional[str] = ..., tail_bytes: _Optional[int] = ..., from_offset: _Optional[bool] = ..., offset: _Optional[int] = ..., snapshot_id: _Optional[str] = ...) -> None: ...

class GetHarnessLogResponse(_message.Message):
    __slots__ = ("content", "size")
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    content: bytes
    size: int
    def __init__(self, content: _Optional[bytes] = ..., size: _Optional[int] = ...) -> None: ...

class GetNodeInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Image(_message.Message):
    __slots__ = ("digest", "names", "size_bytes")
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    NAMES_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    digest: str
    names: _containers.RepeatedScalarFieldContainer[str]
    size_bytes: int
    def __init__(self, digest: _Optional[str] = ..., names: _Optional[_Iterable[str]] = ..., size_bytes: _Optional[int] = ...) -> None: ...

class NodeInfo(_message.Message):
    __slots__ = ("name", "backend", "criu_version", "slots", "memory_mb", "images", "running", "labels", "disk_mb", "restores_forks")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    CRIU_VERSION_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MB_FIELD_NUMBER: _ClassVar[int]
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    DISK_MB_FIELD_NUMBER: _ClassVar[int]
    RESTORES_FORKS_FIELD_NUMBER: _ClassVar[int]
    name: str
    backend: str
    criu_version: str
    slots: int
    memory_mb: int
    images: _containers.RepeatedCompositeFieldContainer[Image]
    running: int
    labels: _containers.ScalarMap[str, str]
    disk_mb: int
    restores_forks: bool
    def __init__(self, name: _Optional[str] = ..., backend: _Optional[str] = ..., criu_version: _Optional[str] = ..., slots: _Optional[int] = ..., memory_mb: _Optional[int] = ..., images: _Optional[_Iterable[_Union[Image, _Mapping]]] = ..., running: _Optional[int] = ..., labels: _Optional[_Mapping[str, str]] = ..., disk_mb: _Optional[int] = ..., restores_forks: _Optional[bool] = ...) -> None: ...

class ImportImageRequest(_message.Message):
    __slots__ = ("name", "tarball", "directory", "docker_image")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TARBALL_FIELD_NUMBER: _ClassVar[int]
    DIRECTORY_FIELD_NUMBER: _ClassVar[int]
    DOCKER_IMAGE_FIELD_NUMBER: _ClassVar[int]
    name: str
    tarball: str
    directory: str
    docker_image: str
    def __init__(self, name: _Optional[str] = ..., tarball: _Optional[str] = ..., directory: _Optional[str] = ..., docker_image: _Optional[str] = ...) -> None: ...

class PullImageRequest(_message.Message):
    __slots__ = ("name", "reference")
    NAME_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_FIELD_NUMBER: _ClassVar[int]
    name: str
    reference: str
    def __init__(self, name: _Optional[str] = ..., reference: _Optional[str] = ...) -> None: ...

class PullProgress(_message.Message):
    __slots__ = ("phase", "bytes_done", "bytes_total", "image")
    PHASE_FIELD_NUMBER: _ClassVar[int]
    BYTES_DONE_FIELD_NUMBER: _ClassVar[int]
    BYTES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    phase: str
    bytes_done: int
    bytes_total: int
    image: Image
    def __init__(self, phase: _Optional[str] = ..., bytes_done: _Optional[int] = ..., bytes_total: _Optional[int] = ..., image: _Optional[_Union[Image, _Mapping]] = ...) -> None: ...

class ResolveImageRequest(_message.Message):
    __slots__ = ("reference",)
    REFERENCE_FIELD_NUMBER: _ClassVar[int]
    reference: str
    def __init__(self, reference: _Optional[str] = ...) -> None: ...

class ResolveImageResponse(_message.Message):
    __slots__ = ("pinned", "digest")
    PINNED_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    pinned: str
    digest: str
    def __init__(self, pinned: _Optional[str] = ..., digest: _Optional[str] = ...) -> None: ...
