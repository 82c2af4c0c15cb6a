"""The seccomp filter every sandbox runs under, as an OCI `linux.seccomp` section.

Calls a harness has no business making fail with EPERM: new namespaces (`unshare`, `setns`,
`clone` with a namespace flag; `clone3` reports ENOSYS so that libc falls back to `clone`,
whose flags the filter can read), mounts and the new mount API, kernel modules, kexec, BPF,
perf events, the kernel keyring, handles that open files by inode, swap, reboot, clocks, quotas,
the kernel log, accounting, userfaultfd and raw I/O ports. Everything else is allowed, so
interpreters, package managers and compilers run as they do under Docker.

CRIU dumps the filter with the task (it suspends it for its parasite code) and restores it
last, so a checkpointed sandbox comes back under the same filter.
"""

from __future__ import annotations

import errno
import platform
from typing import Any

DENIED = (
    "unshare", "setns",
    "mount", "umount", "umount2", "pivot_root", "move_mount", "open_tree", "fsopen", "fsconfig",
    "fsmount", "fspick", "mount_setattr",
    "init_module", "finit_module", "delete_module", "create_module", "kexec_load", "kexec_file_load",
    "bpf", "perf_event_open", "keyctl", "add_key", "request_key", "open_by_handle_at",
    "name_to_handle_at", "swapon", "swapoff", "reboot", "settimeofday", "clock_settime",
    "clock_adjtime", "adjtimex", "quotactl", "quotactl_fd", "syslog", "acct", "userfaultfd",
    "iopl", "ioperm", "lookup_dcookie", "nfsservctl", "uselib", "vm86", "vm86old",
)  # fmt: skip

CLONE_NAMESPACE_FLAGS = {
    "CLONE_NEWNS": 0x00020000,
    "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}

_ARCHITECTURES = {
    "x86_64": ["SCMP_ARCH_X86_64"],
    "aarch64": ["SCMP_ARCH_AARCH64"],
}


def profile() -> dict[str, Any]:
    """The filter for this node's architecture. Only the native ABI is admitted: a call
    through another (32-bit `int 0x80`, x32) kills the caller rather than slip past the names."""
    deny = {"action": "SCMP_ACT_ERRNO", "errnoRet": errno.EPERM}
    return {
        "defaultAction": "SCMP_ACT_ALLOW",
        "architectures": _ARCHITECTURES.get(platform.machine(), []),
        "syscalls": [
            {"names": list(DENIED), **deny},
            {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": errno.ENOSYS},
            # One rule per flag: the filter can test bits, not "any of these bits".
            *(
                {"names": ["clone"], **deny,
                 "args": [{"index": 0, "value": flag, "valueTwo": flag, "op": "SCMP_CMP_MASKED_EQ"}]}
                for flag in CLONE_NAMESPACE_FLAGS.values()
            ),
        ],
    }  # fmt: skip
