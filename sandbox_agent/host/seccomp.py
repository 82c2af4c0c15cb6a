"""The seccomp filter every sandbox runs under, as an OCI `linux.seccomp` section.

An allowlist in the spirit of Docker's default profile: the calls that programs make to
compute, use files, sockets, signals, time, threads and processes are allowed; any other call
fails with ENOSYS, as on a kernel that lacks it, so libc and runtimes fall back as they would
there. Calls a harness has no business making fail with EPERM, even where Docker allows them
to a privileged container: new namespaces (`unshare`, `setns`, `clone` with a namespace flag;
`clone3` reports ENOSYS so that libc falls back to `clone`, whose flags the filter can read),
mounts and the new mount API, kernel modules, kexec, BPF, perf events, the kernel keyring,
handles that open files by inode, swap, reboot, clocks, quotas, the kernel log, accounting,
userfaultfd, raw I/O ports, ptrace's cross-process relatives and io_uring (which CRIU cannot
checkpoint).

CRIU dumps the filter with the task (it suspends it for its parasite code) and restores it
last, so a checkpointed sandbox comes back under the same filter.
"""

from __future__ import annotations

import errno
import platform
from typing import Any

ALLOWED = (
    # files and directories
    "access", "faccessat", "faccessat2", "chdir", "fchdir", "getcwd", "chmod", "fchmod", "fchmodat",
    "fchmodat2", "chown", "fchown", "fchownat", "lchown", "umask", "chroot",
    "open", "openat", "openat2", "creat", "close", "close_range", "read", "readv", "pread64", "preadv",
    "preadv2", "write", "writev", "pwrite64", "pwritev", "pwritev2", "lseek", "sendfile",
    "copy_file_range", "splice", "tee", "vmsplice", "dup", "dup2", "dup3", "fcntl", "flock", "ioctl",
    "stat", "fstat", "lstat", "newfstatat", "statx", "statfs", "fstatfs", "getdents", "getdents64",
    "mkdir", "mkdirat", "mknod", "mknodat", "rmdir", "link", "linkat", "unlink", "unlinkat", "symlink",
    "symlinkat", "readlink", "readlinkat", "rename", "renameat", "renameat2", "truncate", "ftruncate",
    "fallocate", "fadvise64", "readahead", "fsync", "fdatasync", "sync", "syncfs", "sync_file_range",
    "utime", "utimes", "utimensat", "futimesat",
    "getxattr", "lgetxattr", "fgetxattr", "setxattr", "lsetxattr", "fsetxattr", "listxattr",
    "llistxattr", "flistxattr", "removexattr", "lremovexattr", "fremovexattr",
    "getxattrat", "setxattrat", "listxattrat", "removexattrat",
    "inotify_init", "inotify_init1", "inotify_add_watch", "inotify_rm_watch", "fanotify_mark",
    "pipe", "pipe2", "memfd_create", "eventfd", "eventfd2", "signalfd", "signalfd4", "timerfd_create",
    "timerfd_gettime", "timerfd_settime",
    # waiting for I/O
    "select", "pselect6", "poll", "ppoll", "epoll_create", "epoll_create1", "epoll_ctl", "epoll_wait",
    "epoll_pwait", "epoll_pwait2", "io_setup", "io_destroy", "io_submit", "io_cancel", "io_getevents",
    "io_pgetevents",
    # memory
    "brk", "mmap", "munmap", "mremap", "mprotect", "madvise", "mincore", "msync", "mlock", "mlock2",
    "mlockall", "munlock", "munlockall", "membarrier", "remap_file_pages", "pkey_alloc", "pkey_free",
    "pkey_mprotect", "map_shadow_stack", "mseal", "cachestat",
    # processes, threads and their identity
    "clone", "fork", "vfork", "execve", "execveat", "exit", "exit_group", "wait4", "waitid", "kill",
    "tkill", "tgkill", "pidfd_open", "pidfd_send_signal", "getpid", "getppid", "gettid", "getpgid",
    "setpgid", "getpgrp", "getsid", "setsid", "set_tid_address", "arch_prctl", "prctl", "personality",
    "getuid", "geteuid", "getgid", "getegid", "getresuid", "getresgid", "getgroups", "setuid", "setgid",
    "setreuid", "setregid", "setresuid", "setresgid", "setfsuid", "setfsgid", "setgroups", "capget",
    "capset", "getrlimit", "setrlimit", "prlimit64", "getrusage", "getpriority", "setpriority",
    "ioprio_get", "ioprio_set", "uname", "sysinfo", "times", "getrandom", "getcpu", "rseq",
    "set_robust_list", "get_robust_list", "futex", "futex_waitv", "futex_wake", "futex_wait",
    "futex_requeue", "sched_yield", "sched_getaffinity", "sched_setaffinity", "sched_getattr",
    "sched_setattr", "sched_getparam", "sched_setparam", "sched_getscheduler", "sched_setscheduler",
    "sched_get_priority_max", "sched_get_priority_min", "sched_rr_get_interval", "seccomp",
    "landlock_create_ruleset", "landlock_add_rule", "landlock_restrict_self", "ptrace",
    "process_vm_readv", "process_vm_writev", "process_mrelease", "modify_ldt",
    # signals and time
    "rt_sigaction", "rt_sigprocmask", "rt_sigreturn", "rt_sigpending", "rt_sigsuspend",
    "rt_sigtimedwait", "rt_sigqueueinfo", "rt_tgsigqueueinfo", "sigaltstack", "pause", "alarm",
    "getitimer", "setitimer", "nanosleep", "clock_nanosleep", "clock_gettime", "clock_getres",
    "gettimeofday", "time", "timer_create", "timer_delete", "timer_gettime", "timer_settime",
    "timer_getoverrun", "restart_syscall",
    # sockets (the kind is checked below) and System V IPC, inside the sandbox's own namespaces
    "socketpair", "bind", "listen", "accept", "accept4", "connect", "shutdown", "getsockname",
    "getpeername", "getsockopt", "setsockopt", "sendto", "recvfrom", "sendmsg", "recvmsg", "sendmmsg",
    "recvmmsg", "shmget", "shmat", "shmdt", "shmctl", "semget", "semop", "semtimedop", "semctl",
    "msgget", "msgsnd", "msgrcv", "msgctl", "mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive",
    "mq_notify", "mq_getsetattr",
    # aarch64's own names for some of the above
    "set_tls", "sync_file_range2",
)  # fmt: skip
"""Allowed whatever their arguments. Names this node's libseccomp does not know are skipped."""

DENIED = (
    "unshare", "setns",
    "mount", "umount", "umount2", "pivot_root", "move_mount", "open_tree", "fsopen", "fsconfig",
    "fsmount", "fspick", "mount_setattr",
    "init_module", "finit_module", "delete_module", "create_module", "kexec_load", "kexec_file_load",
    "bpf", "perf_event_open", "keyctl", "add_key", "request_key", "open_by_handle_at",
    "name_to_handle_at", "swapon", "swapoff", "reboot", "settimeofday", "clock_settime",
    "clock_adjtime", "adjtimex", "quotactl", "quotactl_fd", "syslog", "acct", "userfaultfd",
    "iopl", "ioperm", "lookup_dcookie", "nfsservctl", "uselib", "vm86", "vm86old",
    "kcmp", "pidfd_getfd", "process_madvise", "fanotify_init", "sethostname", "setdomainname",
    "vhangup", "io_uring_setup", "io_uring_enter", "io_uring_register",
)  # fmt: skip
"""Refused with EPERM: what a contained process may not do, named so the refusal is plain."""

CLONE_NAMESPACE_FLAGS = {
    "CLONE_NEWNS": 0x00020000,
    "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}

AF_VSOCK = 40
"""Sockets to the hypervisor: no sandbox needs one."""

PERSONALITIES = (0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF)
"""PER_LINUX, with UNAME26 and/or PER_LINUX32's flag, and the query: never ADDR_NO_RANDOMIZE."""

_ARCHITECTURES = {
    "x86_64": ["SCMP_ARCH_X86_64"],
    "aarch64": ["SCMP_ARCH_AARCH64"],
}


def profile() -> dict[str, Any]:
    """The filter for this node's architecture. Only the native ABI is admitted: a call
    through another (32-bit `int 0x80`, x32) kills the caller rather than slip past the names."""
    deny = {"action": "SCMP_ACT_ERRNO", "errnoRet": errno.EPERM}
    allow = {"action": "SCMP_ACT_ALLOW"}
    argument_checked = {"clone", "personality"}
    namespaces = sum(CLONE_NAMESPACE_FLAGS.values())
    return {
        "defaultAction": "SCMP_ACT_ERRNO",
        "defaultErrnoRet": errno.ENOSYS,
        "architectures": _ARCHITECTURES.get(platform.machine(), []),
        "syscalls": [
            {"names": [n for n in ALLOWED if n not in argument_checked], **allow},
            {"names": list(DENIED), **deny},
            {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": errno.ENOSYS},
            # clone without a namespace flag; with one, EPERM (the filter tests masked bits).
            {"names": ["clone"], **allow,
             "args": [{"index": 0, "value": namespaces, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}]},
            *({"names": ["clone"], **deny,
               "args": [{"index": 0, "value": flag, "valueTwo": flag, "op": "SCMP_CMP_MASKED_EQ"}]}
              for flag in CLONE_NAMESPACE_FLAGS.values()),
            {"names": ["socket"], **allow, "args": [{"index": 0, "value": AF_VSOCK, "op": "SCMP_CMP_NE"}]},
            {"names": ["socket"], **deny, "args": [{"index": 0, "value": AF_VSOCK, "op": "SCMP_CMP_EQ"}]},
            *({"names": ["personality"], **allow, "args": [{"index": 0, "value": p, "op": "SCMP_CMP_EQ"}]}
              for p in PERSONALITIES),
        ],
    }  # fmt: skip
