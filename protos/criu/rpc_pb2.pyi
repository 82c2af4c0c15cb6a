from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class criu_cg_mode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    IGNORE: _ClassVar[criu_cg_mode]
    CG_NONE: _ClassVar[criu_cg_mode]
    PROPS: _ClassVar[criu_cg_mode]
    SOFT: _ClassVar[criu_cg_mode]
    FULL: _ClassVar[criu_cg_mode]
    STRICT: _ClassVar[criu_cg_mode]
    DEFAULT: _ClassVar[criu_cg_mode]

class criu_network_lock_method(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    IPTABLES: _ClassVar[criu_network_lock_method]
    NFTABLES: _ClassVar[criu_network_lock_method]
    SKIP: _ClassVar[criu_network_lock_method]

class criu_pre_dump_mode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SPLICE: _ClassVar[criu_pre_dump_mode]
    VM_READ: _ClassVar[criu_pre_dump_mode]

class criu_req_type(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EMPTY: _ClassVar[criu_req_type]
    DUMP: _ClassVar[criu_req_type]
    RESTORE: _ClassVar[criu_req_type]
    CHECK: _ClassVar[criu_req_type]
    PRE_DUMP: _ClassVar[criu_req_type]
    PAGE_SERVER: _ClassVar[criu_req_type]
    NOTIFY: _ClassVar[criu_req_type]
    CPUINFO_DUMP: _ClassVar[criu_req_type]
    CPUINFO_CHECK: _ClassVar[criu_req_type]
    FEATURE_CHECK: _ClassVar[criu_req_type]
    VERSION: _ClassVar[criu_req_type]
    WAIT_PID: _ClassVar[criu_req_type]
    PAGE_SERVER_CHLD: _ClassVar[criu_req_type]
    SINGLE_PRE_DUMP: _ClassVar[criu_req_type]
IGNORE: criu_cg_mode
CG_NONE: criu_cg_mode
PROPS: criu_cg_mode
SOFT: criu_cg_mode
FULL: criu_cg_mode
STRICT: criu_cg_mode
DEFAULT: criu_cg_mode
IPTABLES: criu_network_lock_method
NFTABLES: criu_network_lock_method
SKIP: criu_network_lock_method
SPLICE: criu_pre_dump_mode
VM_READ: criu_pre_dump_mode
EMPTY: criu_req_type
DUMP: criu_req_type
RESTORE: criu_req_type
CHECK: criu_req_type
PRE_DUMP: criu_req_type
PAGE_SERVER: criu_req_type
NOTIFY: criu_req_type
CPUINFO_DUMP: criu_req_type
CPUINFO_CHECK: criu_req_type
FEATURE_CHECK: criu_req_type
VERSION: criu_req_type
WAIT_PID: criu_req_type
PAGE_SERVER_CHLD: criu_req_type
SINGLE_PRE_DUMP: criu_req_type

class criu_page_server_info(_message.Message):
    __slots__ = ("address", "port", "pid", "fd")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    FD_FIELD_NUMBER: _ClassVar[int]
    address: str
    port: int
    pid: int
    fd: int
    def __init__(self, address: _Optional[str] = ..., port: _Optional[int] = ..., pid: _Optional[int] = ..., fd: _Optional[int] = ...) -> None: ...

class criu_veth_pair(_message.Message):
    __slots__ = ("if_in", "if_out")
    IF_IN_FIELD_NUMBER: _ClassVar[int]
    IF_OUT_FIELD_NUMBER: _ClassVar[int]
    if_in: str
    if_out: str
    def __init__(self, if_in: _Optional[str] = ..., if_out: _Optional[str] = ...) -> None: ...

class ext_mount_map(_message.Message):
    __slots__ = ("key", "val")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VAL_FIELD_NUMBER: _ClassVar[int]
    key: str
    val: str
    def __init__(self, key: _Optional[str] = ..., val: _Optional[str] = ...) -> None: ...

class join_namespace(_message.Message):
    __slots__ = ("ns", "ns_file", "extra_opt")
    NS_FIELD_NUMBER: _ClassVar[int]
    NS_FILE_FIELD_NUMBER: _ClassVar[int]
    EXTRA_OPT_FIELD_NUMBER: _ClassVar[int]
    ns: str
    ns_file: str
    extra_opt: str
    def __init__(self, ns: _Optional[str] = ..., ns_file: _Optional[str] = ..., extra_opt: _Optional[str] = ...) -> None: ...

class inherit_fd(_message.Message):
    __slots__ = ("key", "fd")
    KEY_FIELD_NUMBER: _ClassVar[int]
    FD_FIELD_NUMBER: _ClassVar[int]
    key: str
    fd: int
    def __init__(self, key: _Optional[str] = ..., fd: _Optional[int] = ...) -> None: ...

class cgroup_root(_message.Message):
    __slots__ = ("ctrl", "path")
    CTRL_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    ctrl: str
    path: str
    def __init__(self, ctrl: _Optional[str] = ..., path: _Optional[str] = ...) -> None: ...

class unix_sk(_message.Message):
    __slots__ = ("inode",)
    INODE_FIELD_NUMBER: _ClassVar[int]
    inode: int
    def __init__(self, inode: _Optional[int] = ...) -> None: ...

class criu_opts(_message.Message):
    __slots__ = ("images_dir_fd", "images_dir", "pid", "leave_running", "ext_unix_sk", "tcp_established", "evasive_devices", "shell_job", "file_locks", "log_level", "log_file", "ps", "notify_scripts", "root", "parent_img", "track_mem", "auto_dedup", "work_dir_fd", "link_remap", "veths", "cpu_cap", "force_irmap", "exec_cmd", "ext_mnt", "manage_cgroups", "cg_root", "rst_sibling", "inherit_fd", "auto_ext_mnt", "ext_sharing", "ext_masters", "skip_mnt", "enable_fs", "unix_sk_ino", "manage_cgroups_mode", "ghost_limit", "irmap_scan_paths", "external", "empty_ns", "join_ns", "cgroup_props", "cgroup_props_file", "cgroup_dump_controller", "freeze_cgroup", "timeout", "tcp_skip_in_flight", "weak_sysctls", "lazy_pages", "status_fd", "orphan_pts_master", "config_file", "tcp_close", "lsm_profile", "tls_cacert", "tls_cacrl", "tls_cert", "tls_key", "tls", "tls_no_cn_verify", "cgroup_yard", "pre_dump_mode", "pidfd_store_sk", "lsm_mount_context", "network_lock", "mntns_compat_mode", "skip_file_rwx_check", "unprivileged", "leave_stopped", "display_stats", "log_to_stderr")
    IMAGES_DIR_FD_FIELD_NUMBER: _ClassVar[int]
    IMAGES_DIR_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    LEAVE_RUNNING_FIELD_NUMBER: _ClassVar[int]
    EXT_UNIX_SK_FIELD_NUMBER: _ClassVar[int]
    TCP_ESTABLISHED_FIELD_NUMBER: _ClassVar[int]
    EVASIVE_DEVICES_FIELD_NUMBER: _ClassVar[int]
    SHELL_JOB_FIELD_NUMBER: _ClassVar[int]
    FILE_LOCKS_FIELD_NUMBER: _ClassVar[int]
    LOG_LEVEL_FIELD_NUMBER: _ClassVar[int]
    LOG_FILE_FIELD_NUMBER: _ClassVar[int]
    PS_FIELD_NUMBER: _ClassVar[int]
    NOTIFY_SCRIPTS_FIELD_NUMBER: _ClassVar[int]
    ROOT_FIELD_NUMBER: _ClassVar[int]
    PARENT_IMG_FIELD_NUMBER: _ClassVar[int]
    TRACK_MEM_FIELD_NUMBER: _ClassVar[int]
    AUTO_DEDUP_FIELD_NUMBER: _ClassVar[int]
    WORK_DIR_FD_FIELD_NUMBER: _ClassVar[int]
    LINK_REMAP_FIELD_NUMBER: _ClassVar[int]
    VETHS_FIELD_NUMBER: _ClassVar[int]
    CPU_CAP_FIELD_NUMBER: _ClassVar[int]
    FORCE_IRMAP_FIELD_NUMBER: _ClassVar[int]
    EXEC_CMD_FIELD_NUMBER: _ClassVar[int]
    EXT_MNT_FIELD_NUMBER: _ClassVar[int]
    MANAGE_CGROUPS_FIELD_NUMBER: _ClassVar[int]
    CG_ROOT_FIELD_NUMBER: _ClassVar[int]
    RST_SIBLING_FIELD_NUMBER: _ClassVar[int]
    INHERIT_FD_FIELD_NUMBER: _ClassVar[int]
    AUTO_EXT_MNT_FIELD_NUMBER: _ClassVar[int]
    EXT_SHARING_FIELD_NUMBER: _ClassVar[int]
    EXT_MASTERS_FIELD_NUMBER: _ClassVar[int]
    SKIP_MNT_FIELD_NUMBER: _ClassVar[int]
    ENABLE_FS_FIELD_NUMBER: _ClassVar[int]
    UNIX_SK_INO_FIELD_NUMBER: _ClassVar[int]
    MANAGE_CGROUPS_MODE_FIELD_NUMBER: _ClassVar[int]
    GHOST_LIMIT_FIELD_NUMBER: _ClassVar[int]
    IRMAP_SCAN_PATHS_FIELD_NUMBER: _ClassVar[int]
    EXTERNAL_FIELD_NUMBER: _ClassVar[int]
    EMPTY_NS_FIELD_NUMBER: _ClassVar[int]
    JOIN_NS_FIELD_NUMBER: _ClassVar[int]
    CGROUP_PROPS_FIELD_NUMBER: _ClassVar[int]
    CGROUP_PROPS_FILE_FIELD_NUMBER: _ClassVar[int]
    CGROUP_DUMP_CONTROLLER_FIELD_NUMBER: _ClassVar[int]
    FREEZE_CGROUP_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    TCP_SKIP_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    WEAK_SYSCTLS_FIELD_NUMBER: _ClassVar[int]
    LAZY_PAGES_FIELD_NUMBER: _ClassVar[int]
    STATUS_FD_FIELD_NUMBER: _ClassVar[int]
    ORPHAN_PTS_MASTER_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FILE_FIELD_NUMBER: _ClassVar[int]
    TCP_CLOSE_FIELD_NUMBER: _ClassVar[int]
    LSM_PROFILE_FIELD_NUMBER: _ClassVar[int]
    TLS_CACERT_FIELD_NUMBER: _ClassVar[int]
    TLS_CACRL_FIELD_NUMBER: _ClassVar[int]
    TLS_CERT_FIELD_NUMBER: _ClassVar[int]
    TLS_KEY_FIELD_NUMBER: _ClassVar[int]
    TLS_FIELD_NUMBER: _ClassVar[int]
    TLS_NO_CN_VERIFY_FIELD_NUMBER: _ClassVar[int]
    CGROUP_YARD_FIELD_NUMBER: _ClassVar[int]
    PRE_DUMP_MODE_FIELD_NUMBER: _ClassVar[int]
    PIDFD_STORE_SK_FIELD_NUMBER: _ClassVar[int]
    LSM_MOUNT_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    NETWORK_LOCK_FIELD_NUMBER: _ClassVar[int]
    MNTNS_COMPAT_MODE_FIELD_NUMBER: _ClassVar[int]
    SKIP_FILE_RWX_CHECK_FIELD_NUMBER: _ClassVar[int]
    UNPRIVILEGED_FIELD_NUMBER: _ClassVar[int]
    LEAVE_STOPPED_FIELD_NUMBER: _ClassVar[int]
    DISPLAY_STATS_FIELD_NUMBER: _ClassVar[int]
    LOG_TO_STDERR_FIELD_NUMBER: _ClassVar[int]
    images_dir_fd: int
    images_dir: str
    pid: int
    leave_running: bool
    ext_unix_sk: bool
    tcp_established: bool
    evasive_devices: bool
    shell_job: bool
    file_locks: bool
    log_level: int
    log_file: str
    ps: criu_page_server_info
    notify_scripts: bool
    root: str
    parent_img: str
    track_mem: bool
    auto_dedup: bool
    work_dir_fd: int
    link_remap: bool
    veths: _containers.RepeatedCompositeFieldContainer[criu_veth_pair]
    cpu_cap: int
    force_irmap: bool
    exec_cmd: _containers.RepeatedScalarFieldContainer[str]
    ext_mnt: _containers.RepeatedCompositeFieldContainer[ext_mount_map]
    manage_cgroups: bool
    cg_root: _containers.RepeatedCompositeFieldContainer[cgroup_root]
    rst_sibling: bool
    inherit_fd: _containers.RepeatedCompositeFieldContainer[inherit_fd]
    auto_ext_mnt: bool
    ext_sharing: bool
    ext_masters: bool
    skip_mnt: _containers.RepeatedScalarFieldContainer[str]
    enable_fs: _containers.RepeatedScalarFieldContainer[str]
    unix_sk_ino: _containers.RepeatedCompositeFieldContainer[unix_sk]
    manage_cgroups_mode: criu_cg_mode
    ghost_limit: int
    irmap_scan_paths: _containers.RepeatedScalarFieldContainer[str]
    external: _containers.RepeatedScalarFieldContainer[str]
    empty_ns: int
    join_ns: _containers.RepeatedCompositeFieldContainer[join_namespace]
    cgroup_props: str
    cgroup_props_file: str
    cgroup_dump_controller: _containers.RepeatedScalarFieldContainer[str]
    freeze_cgroup: str
    timeout: int
    tcp_skip_in_flight: bool
    weak_sysctls: bool
    lazy_pages: bool
    status_fd: int
    orphan_pts_master: bool
    config_file: str
    tcp_close: bool
    lsm_profile: str
    tls_cacert: str
    tls_cacrl: str
    tls_cert: str
    tls_key: str
    tls: bool
    tls_no_cn_verify: bool
    cgroup_yard: str
    pre_dump_mode: criu_pre_dump_mode
    pidfd_store_sk: int
    lsm_mount_context: str
    network_lock: criu_network_lock_method
    mntns_compat_mode: bool
    skip_file_rwx_check: bool
    unprivileged: bool
    leave_stopped: bool
    display_stats: bool
    log_to_stderr: bool
    def __init__(self, images_dir_fd: _Optional[int] = ..., images_dir: _Optional[str] = ..., pid: _Optional[int] = ..., leave_running: _Optional[bool] = ..., ext_unix_sk: _Optional[bool] = ..., tcp_established: _Optional[bool] = ..., evasive_devices: _Optional[bool] = ..., shell_job: _Optional[bool] = ..., file_locks: _Optional[bool] = ..., log_level: _Optional[int] = ..., log_file: _Optional[str] = ..., ps: _Optional[_Union[criu_page_server_info, _Mapping]] = ..., notify_scripts: _Optional[bool] = ..., root: _Optional[str] = ..., parent_img: _Optional[str] = ..., track_mem: _Optional[bool] = ..., auto_dedup: _Optional[bool] = ..., work_dir_fd: _Optional[int] = ..., link_remap: _Optional[bool] = ..., veths: _Optional[_Iterable[_Union[criu_veth_pair, _Mapping]]] = ..., cpu_cap: _Optional[int] = ..., force_irmap: _Optional[bool] = ..., exec_cmd: _Optional[_Iterable[str]] = ..., ext_mnt: _Optional[_Iterable[_Union[ext_mount_map, _Mapping]]] = ..., manage_cgroups: _Optional[bool] = ..., cg_root: _Optional[_Iterable[_Union[cgroup_root, _Mapping]]] = ..., rst_sibling: _Optional[bool] = ..., inherit_fd: _Optional[_Iterable[_Union[inherit_fd, _Mapping]]] = ..., auto_ext_mnt: _Optional[bool] = ..., ext_sharing: _Optional[bool] = ..., ext_masters: _Optional[bool] = ..., skip_mnt: _Optional[_Iterable[str]] = ..., enable_fs: _Optional[_Iterable[str]] = ..., unix_sk_ino: _Optional[_Iterable[_Union[unix_sk, _Mapping]]] = ..., manage_cgroups_mode: _Optional[_Union[criu_cg_mode, str]] = ..., ghost_limit: _Optional[int] = ..., irmap_scan_paths: _Optional[_Iterable[str]] = ..., external: _Optional[_Iterable[str]] = ..., empty_ns: _Optional[int] = ..., join_ns: _Optional[_Iterable[_Union[join_namespace, _Mapping]]] = ..., cgroup_props: _Optional[str] = ..., cgroup_props_file: _Optional[str] = ..., cgroup_dump_controller: _Optional[_Iterable[str]] = ..., freeze_cgroup: _Optional[str] = ..., timeout: _Optional[int] = ..., tcp_skip_in_flight: _Optional[bool] = ..., weak_sysctls: _Optional[bool] = ..., lazy_pages: _Optional[bool] = ..., status_fd: _Optional[int] = ..., orphan_pts_master: _Optional[bool] = ..., config_file: _Optional[str] = ..., tcp_close: _Optional[bool] = ..., lsm_profile: _Optional[str] = ..., tls_cacert: _Optional[str] = ..., tls_cacrl: _Optional[str] = ..., tls_cert: _Optional[str] = ..., tls_key: _Optional[str] = ..., tls: _Optional[bool] = ..., tls_no_cn_verify: _Optional[bool] = ..., cgroup_yard: _Optional[str] = ..., pre_dump_mode: _Optional[_Union[criu_pre_dump_mode, str]] = ..., pidfd_store_sk: _Optional[int] = ..., lsm_mount_context: _Optional[str] = ..., network_lock: _Optional[_Union[criu_network_lock_method, str]] = ..., mntns_compat_mode: _Optional[bool] = ..., skip_file_rwx_check: _Optional[bool] = ..., unprivileged: _Optional[bool] = ..., leave_stopped: _Optional[bool] = ..., display_stats: _Optional[bool] = ..., log_to_stderr: _Optional[bool] = ...) -> None: ...

class criu_dump_resp(_message.Message):
    __slots__ = ("restored",)
    RESTORED_FIELD_NUMBER: _ClassVar[int]
    restored: bool
    def __init__(self, restored: _Optional[bool] = ...) -> None: ...

class criu_restore_resp(_message.Message):
    __slots__ = ("pid",)
    PID_FIELD_NUMBER: _ClassVar[int]
    pid: int
    def __init__(self, pid: _Optional[int] = ...) -> None: ...

class criu_notify(_message.Message):
    __slots__ = ("script", "pid")
    SCRIPT_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    script: str
    pid: int
    def __init__(self, script: _Optional[str] = ..., pid: _Optional[int] = ...) -> None: ...

class criu_features(_message.Message):
    __slots__ = ("mem_track", "lazy_pages", "pidfd_store")
    MEM_TRACK_FIELD_NUMBER: _ClassVar[int]
    LAZY_PAGES_FIELD_NUMBER: _ClassVar[int]
    PIDFD_STORE_FIELD_NUMBER: _ClassVar[int]
    mem_track: bool
    lazy_pages: bool
    pidfd_store: bool
    def __init__(self, mem_track: _Optional[bool] = ..., lazy_pages: _Optional[bool] = ..., pidfd_store: _Optional[bool] = ...) -> None: ...

class criu_req(_message.Message):
    __slots__ = ("type", "opts", "notify_success", "keep_open", "features", "pid")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    OPTS_FIELD_NUMBER: _ClassVar[int]
    NOTIFY_SUCCESS_FIELD_NUMBER: _ClassVar[int]
    KEEP_OPEN_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    type: criu_req_type
    opts: criu_opts
    notify_success: bool
    keep_open: bool
    features: criu_features
    pid: int
    def __init__(self, type: _Optional[_Union[criu_req_type, str]] = ..., opts: _Optional[_Union[criu_opts, _Mapping]] = ..., notify_success: _Optional[bool] = ..., keep_open: _Optional[bool] = ..., features: _Optional[_Union[criu_features, _Mapping]] = ..., pid: _Optional[int] = ...) -> None: ...

class criu_resp(_message.Message):
    __slots__ = ("type", "success", "dump", "restore", "notify", "ps", "cr_errno", "features", "cr_errmsg", "version", "status")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    DUMP_FIELD_NUMBER: _ClassVar[int]
    RESTORE_FIELD_NUMBER: _ClassVar[int]
    NOTIFY_FIELD_NUMBER: _ClassVar[int]
    PS_FIELD_NUMBER: _ClassVar[int]
    CR_ERRNO_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    CR_ERRMSG_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    type: criu_req_type
    success: bool
    dump: criu_dump_resp
    restore: criu_restore_resp
    notify: criu_notify
    ps: criu_page_server_info
    cr_errno: int
    features: criu_features
    cr_errmsg: str
    version: criu_version
    status: int
    def __init__(self, type: _Optional[_Union[criu_req_type, str]] = ..., success: _Optional[bool] = ..., dump: _Optional[_Union[criu_dump_resp, _Mapping]] = ..., restore: _Optional[_Union[criu_restore_resp, _Mapping]] = ..., notify: _Optional[_Union[criu_notify, _Mapping]] = ..., ps: _Optional[_Union[criu_page_server_info, _Mapping]] = ..., cr_errno: _Optional[int] = ..., features: _Optional[_Union[criu_features, _Mapping]] = ..., cr_errmsg: _Optional[str] = ..., version: _Optional[_Union[criu_version, _Mapping]] = ..., status: _Optional[int] = ...) -> None: ...

class criu_version(_message.Message):
    __slots__ = ("major_number", "minor_number", "gitid", "sublevel", "extra", "name")
    MAJOR_NUMBER_FIELD_NUMBER: _ClassVar[int]
    MINOR_NUMBER_FIELD_NUMBER: _ClassVar[int]
    GITID_FIELD_NUMBER: _ClassVar[int]
    SUBLEVEL_FIELD_NUMBER: _ClassVar[int]
    EXTRA_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    major_number: int
    minor_number: int
    gitid: str
    sublevel: int
    extra: int
    name: str
    def __init__(self, major_number: _Optional[int] = ..., minor_number: _Optional[int] = ..., gitid: _Optional[str] = ..., sublevel: _Optional[int] = ..., extra: _Optional[int] = ..., name: _Optional[str] = ...) -> None: ...
