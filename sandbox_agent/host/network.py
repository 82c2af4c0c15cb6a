"""Per-sandbox network namespaces wired the same way on every node.

Every sandbox sees `169.254.1.1 dev eth0 scope link; default via 169.254.1.1` and its own
address. The node side of each veth has no address and answers ARP by proxy; the node holds
169.254.1.1/32 and a /32 route to each sandbox. So an episode restores on any node, beside any
other sandbox, with the same addresses it holds in memory.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import ipaddress
import os
import shlex
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from pathlib import Path

from protos.shared.address import egress_rule
from sandbox_agent.errors import AlreadyExists, FailedPrecondition, InvalidSpec
from sandbox_agent.host import netlink, tools
from sandbox_agent.host._libc import check, libc

GATEWAY_IP = "169.254.1.1"
VETH_PREFIX = "stx"
NETNS_PREFIX = "stasis-"
"""A sandbox's netns and its veth are named by these and the same hash of node and sandbox."""
NETNS_DIR = Path("/var/run/netns")
ISOLATION_CHAIN = "STASIS-SANDBOX"
ALLOWANCE_MARK = "stasis-node:"
"""How an allowance rule's comment names the node it belongs to."""
EGRESS_MARK = "stasis-egress:"
"""How a sandbox's egress rules' comment names it (by the hash its netns is named by)."""
TCP_EHASH_ENTRIES = 256
"""Buckets of a sandbox netns's own TCP hash table: ample for a harness's few connections."""
CLONE_NEWNET = 0x40000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
_MS_BIND, _MS_REC, _MS_SHARED = 0x1000, 0x4000, 0x100000
_MNT_DETACH = 0x2


def validate_address(address: str) -> str:
    if not address:
        return ""
    try:
        ip = ipaddress.IPv4Address(address)
    except ipaddress.AddressValueError as exc:
        raise InvalidSpec("address", f"{address!r} is not an IPv4 address") from exc
    if ip.is_loopback or ip.is_multicast or ip.is_unspecified or ip.is_link_local:
        raise InvalidSpec("address", f"{address} is loopback, link-local, multicast or unspecified")
    return str(ip)


def _short(node: str, sandbox_id: str) -> str:
    return hashlib.sha1(f"{node}/{sandbox_id}".encode()).hexdigest()[:11]


def netns_name(node: str, sandbox_id: str) -> str:
    return f"{NETNS_PREFIX}{_short(node, sandbox_id)}"


def netns_path(node: str, sandbox_id: str) -> Path:
    return NETNS_DIR / netns_name(node, sandbox_id)


def veth_name(node: str, sandbox_id: str) -> str:
    return f"{VETH_PREFIX}{_short(node, sandbox_id)}"


def _ip(*args: str, check: bool = True) -> tools.Completed:
    return tools.run(["ip", *args], check=check, what=f"ip {' '.join(args[:3])}")


def _iptables(*args: str, check: bool = True) -> tools.Completed:
    return tools.run(["iptables", "-w", *args], check=check, what=f"iptables {' '.join(args[:3])}")


def _allowance(node: str, port: int) -> tuple[str, ...]:
    """The rule that lets sandboxes reach `port` on the gateway address, marked as `node`'s."""
    return ("-d", f"{GATEWAY_IP}/32", "-p", "tcp", "-m", "tcp", "--dport", str(port),
            "-m", "comment", "--comment", f"{ALLOWANCE_MARK}{node}", "-j", "RETURN")  # fmt: skip


def allowances(node: str | None = None, unmarked: bool = True) -> list[tuple[str, ...]]:
    """The allowance rules in the isolation chain, as `iptables -S` spells them (without `-A
    CHAIN`): `node`'s, or every node's. Rules of an agent that marked none count for any node
    unless `unmarked` is False."""
    ours = [r for r in _listed("filter", ISOLATION_CHAIN) if "--dport" in r and r[-2:] == ("-j", "RETURN")]
    if node is None:
        return ours
    marks = (f"{ALLOWANCE_MARK}{node}", *((None,) if unmarked else ()))
    return [r for r in ours if _mark(r) in marks]


def _listed(table: str, chain: str) -> list[tuple[str, ...]]:
    """The chain's rules as `iptables -S` spells them, without `-A CHAIN` (none if it is absent)."""
    listed = _iptables("-t", table, "-S", chain, check=False)
    return [tuple(shlex.split(line))[2:] for line in listed.stdout.decode().splitlines()]


def _mark(rule: tuple[str, ...]) -> str | None:
    return rule[rule.index("--comment") + 1] if "--comment" in rule else None


def prepare_node(node: str, allowed_ports: Sequence[int], owns_unmarked: bool = True) -> None:
    """Give the node 169.254.1.1 and the rule that sandboxes reach nothing but its allowed ports,
    and the agent the netns its sandboxes' netns are made from (`_parent_netns`).

    Each node's allowances are marked with `node` (its `AgentSettings.host_key`, so a node of
    another stack on the host has other marks), and a node that starts again with other ports
    drops the ones it no longer allows: a gateway that moved leaves no port open behind it.
    Rules marked with no node are an older agent's; only a node that `owns_unmarked` (one of the
    host's only stack, as such agents were) drops them, never a node of another stack.
    """
    if GATEWAY_IP not in _ip("-4", "addr", "show", "dev", "lo").stdout.decode():
        _ip("addr", "add", f"{GATEWAY_IP}/32", "dev", "lo", check=False)
    if _iptables("-n", "-L", ISOLATION_CHAIN, check=False).returncode != 0:
        _iptables("-N", ISOLATION_CHAIN, check=False)
    wanted = [_allowance(node, p) for p in sorted(set(allowed_ports))]
    established = ("-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "RETURN")
    for rule in [*wanted, established]:
        if _iptables("-C", ISOLATION_CHAIN, *rule, check=False).returncode != 0:
            # Insert before the final DROP.
            _iptables("-I", ISOLATION_CHAIN, "1", *rule)
    for rule in allowances(node, unmarked=owns_unmarked):
        if rule not in wanted:
            _iptables("-D", ISOLATION_CHAIN, *rule, check=False)
    if _iptables("-C", ISOLATION_CHAIN, "-j", "DROP", check=False).returncode != 0:
        _iptables("-A", ISOLATION_CHAIN, "-j", "DROP")
    for chain in ("INPUT", "FORWARD"):
        jump = ("-i", f"{VETH_PREFIX}+", "-j", ISOLATION_CHAIN)
        if _iptables("-C", chain, *jump, check=False).returncode != 0:
            _iptables("-I", chain, "1", *jump)
    jump_out = (
        "-o",
        f"{VETH_PREFIX}+",
        "-m",
        "conntrack",
        "!",
        "--ctstate",
        "ESTABLISHED,RELATED",
        "-j",
        "DROP",
    )
    if _iptables("-C", "FORWARD", *jump_out, check=False).returncode != 0:
        _iptables("-I", "FORWARD", "1", *jump_out)
    _parent_netns()  # made now, not on the node's first restore


def allow_egress(node: str, sandbox_id: str, address: str, egress: Sequence[str]) -> None:
    """Let the sandbox at `address` connect where `egress` allows (`egress_rule`), besides the
    gateway: a rule in the isolation chain before its DROP for each, and one that masquerades
    what leaves the node as the node (the node must forward, as Kubernetes nodes do). Both
    carry the sandbox's mark, for `revoke_egress`."""
    for table, chain, rule in _egress_rules(node, sandbox_id, address, egress):
        _iptables("-t", table, "-I", chain, "1", *rule)


def revoke_egress(node: str, sandbox_id: str) -> None:
    """Remove every egress rule of the sandbox; none is fine."""
    mark = f"{EGRESS_MARK}{_short(node, sandbox_id)}"
    for table, chain in (("filter", ISOLATION_CHAIN), ("nat", "POSTROUTING")):
        for rule in _listed(table, chain):
            if _mark(rule) == mark:
                _iptables("-t", table, "-D", chain, *rule, check=False)


def _egress_rules(
    node: str, sandbox_id: str, address: str, egress: Sequence[str]
) -> list[tuple[str, str, tuple[str, ...]]]:
    mark = ("-m", "comment", "--comment", f"{EGRESS_MARK}{_short(node, sandbox_id)}")
    rules: list[tuple[str, str, tuple[str, ...]]] = []
    for entry in egress:
        destination, port = egress_rule(entry)
        match: tuple[str, ...] = ("-s", f"{address}/32", "-d", destination)
        if port is not None:
            match += ("-p", "tcp", "-m", "tcp", "--dport", str(port))
        rules.append(("filter", ISOLATION_CHAIN, (*match, *mark, "-j", "RETURN")))
        rules.append(
            ("nat", "POSTROUTING", (*match, "!", "-o", f"{VETH_PREFIX}+", *mark, "-j", "MASQUERADE"))
        )
    return rules


def create(node: str, sandbox_id: str, address: str, mtu: int = 1500) -> Path:
    """Make the sandbox's netns; with an address, wire its veth. Returns the netns path.

    It is on the way of every restore, and starts no process: the netns is made and wired from
    a thread of the agent (`_new_netns`), over route netlink (`netlink.Route`), where three `ip`
    processes took 11-15 ms."""
    ns = netns_name(node, sandbox_id)
    path = NETNS_DIR / ns
    if path.exists():
        raise AlreadyExists(f"network namespace {ns} of sandbox {sandbox_id!r} already exists")
    host_side = veth_name(node, sandbox_id)
    # A sandbox destroyed a moment ago may still have its veth and route: the kernel removes
    # them with its netns, once nothing holds that (`destroy`). One in the way goes now.
    for link in {host_side, _route_device(address) if address else ""}:
        if _departed(link):
            with suppress(FailedPrecondition), netlink.Route() as route:  # gone meanwhile
                route.delete_link(link)
    if address and _routed(address):
        raise AlreadyExists(f"address {address} is already routed to a sandbox on this host")
    try:
        with open("/proc/thread-self/ns/net", "rb", buffering=0) as node_netns:
            _new_netns(path, lambda: _wire_inside(address, host_side, node_netns.fileno(), mtu))
        if address:
            _disable_ipv6(host_side)
            Path(f"/proc/sys/net/ipv4/conf/{host_side}/proxy_arp").write_text("1")
            with netlink.Route() as route:
                route.up(host_side)
                route.add_route(host_side, address, 32)
    except Exception:
        destroy(node, sandbox_id)
        raise
    return path


def _wire_inside(address: str, host_side: str, node_netns: int, mtu: int) -> None:
    """From a thread in the sandbox's new netns: loopback up and, with an address, eth0, whose
    peer `host_side` is made straight in the node's netns (moving a link between netns waits
    for the kernel's network-wide synchronisation, 20-40 ms), with the address and the routes
    every sandbox has."""
    with netlink.Route() as route:
        route.up("lo")
        if address:
            route.add_veth("eth0", host_side, node_netns, mtu)
            route.add_address("eth0", address, 32)
            route.up("eth0")
            route.add_route("eth0", GATEWAY_IP, 32)
            route.add_route("eth0", "0.0.0.0", 0, gateway=GATEWAY_IP)


def _new_netns(path: Path, wire: Callable[[], None]) -> None:
    """A new netns, named by `path` as `ip netns add` names one, made from a thread of its own,
    which then calls `wire` inside it.

    It gets TCP hash tables of its own (`tcp_child_ehash_entries`), where a netns shares the
    host's by default: CRIU's dump asks the kernel for the sandbox's TCP sockets, and the
    kernel then walks every bucket of the host's tables (262,144 here), 2-3 ms of every freeze;
    and one sandbox's connections no longer share hash chains with another's. The setting is
    read from the netns the new one is made from, so the thread makes it from the agent's
    parent netns (`_parent_netns`). The sandbox's netns starts with no IPv6 at all (loopback
    included, and eth0, which takes the netns's defaults: IPv4 to the gateway is the only way
    out), and lets its root, which holds no capability over the node's netns, serve on low
    ports as it could without a user namespace."""
    _shared_netns_dir()
    parent = _parent_netns()
    os.close(os.open(path, os.O_RDONLY | os.O_CREAT | os.O_EXCL, 0))

    def made() -> None:
        if parent is not None:
            check(libc.setns(parent, CLONE_NEWNET), "joining the parent network namespace")
        check(libc.unshare(CLONE_NEWNET), "making a network namespace")
        Path("/proc/sys/net/ipv4/ip_unprivileged_port_start").write_text("0")
        for link in ("all", "default"):
            _disable_ipv6(link)
        check(
            libc.mount(b"/proc/thread-self/ns/net", os.fsencode(path), None, _MS_BIND, None),
            f"naming it {path}",
        )
        wire()

    _in_thread(made)


_parent_lock = threading.Lock()
_parent: list[int | None] = []
"""The parent netns's descriptor, once made (None: sandboxes share the host's TCP tables)."""


def _parent_netns() -> int | None:
    """A netns of the agent's, empty and never wired, whose `tcp_child_ehash_entries` gives the
    netns made from it TCP tables of their own; made once, and held open while the agent runs.
    Where a netns was made for each sandbox only to set that, every restore paid for making it
    and the kernel for tearing it down (about 0.5 ms of CPU each here). None where the kernel
    has no such setting (before Linux 6.1) or refuses it."""
    with _parent_lock:
        if not _parent:
            _parent.append(None)
            child_tables = Path("/proc/sys/net/ipv4/tcp_child_ehash_entries")
            if child_tables.exists():

                def made() -> None:
                    check(libc.unshare(CLONE_NEWNET), "making the parent network namespace")
                    with suppress(OSError):  # refused: sandboxes share the host's tables
                        child_tables.write_text(str(TCP_EHASH_ENTRIES))
                        _parent[0] = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)

                _in_thread(made)
        return _parent[0]


def _shared_netns_dir() -> None:
    """Make NETNS_DIR a shared mount, as `ip netns add` does: a netns named there then reaches
    other mount namespaces (a pod's, through `mountPropagation: Bidirectional`), and goes from
    all of them when its name is removed."""
    NETNS_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
    target = os.fsencode(NETNS_DIR)
    if libc.mount(b"none", target, None, _MS_SHARED | _MS_REC, None) == 0:
        return
    if ctypes.get_errno() != errno.EINVAL:  # EINVAL: not a mount point yet
        check(-1, f"making {NETNS_DIR} a shared mount")
    check(libc.mount(target, target, None, _MS_BIND | _MS_REC, None), f"making {NETNS_DIR} a mount point")
    check(libc.mount(b"none", target, None, _MS_SHARED | _MS_REC, None), f"making {NETNS_DIR} a shared mount")


def _departed(link: str) -> bool:
    """Whether `link` is a sandbox's veth whose netns `destroy` has dropped."""
    if not link.startswith(VETH_PREFIX) or not Path(f"/sys/class/net/{link}").exists():
        return False
    return not (NETNS_DIR / f"{NETNS_PREFIX}{link.removeprefix(VETH_PREFIX)}").exists()


def _route_device(address: str) -> str:
    """The link the host's main table routes `address` (a /32) through, or ""."""
    packed = f"{int.from_bytes(ipaddress.IPv4Address(address).packed, 'little'):08X}"
    with open("/proc/net/route") as routes:
        next(routes)  # the header
        return next(
            (f[0] for f in (line.split() for line in routes) if f[1] == packed and f[7] == "FFFFFFFF"), ""
        )


def _routed(address: str) -> bool:
    """Whether the host's main table has a /32 route to `address` (a sandbox's, on this host)."""
    return bool(_route_device(address))


def mount_sysfs(node: str, sandbox_id: str, target: Path) -> None:
    """Mount, read-only, a sysfs that shows the sandbox's netns (sysfs shows its mounter's) at
    `target`: from a thread that joined the netns, not an `nsenter` process (2-3 ms of a restore)."""

    def mount() -> None:
        flags = _MS_RDONLY | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
        mounted = libc.mount(b"sysfs", os.fsencode(target), b"sysfs", flags, None)
        check(mounted, f"mounting the sysfs of sandbox {sandbox_id}'s netns at {target}")

    _in_thread(mount, netns_path(node, sandbox_id))


def _in_thread(work: Callable[[], None], netns: Path | None = None) -> None:
    """Run `work` in a thread of its own, which first joins `netns` if given (its /proc/sys/net is
    then that netns's), as `nsenter --net` would without starting a process. Namespaces are per
    thread: the agent's other threads stay where they are, and this one ends where it went."""
    failure: list[BaseException] = []

    def run() -> None:
        try:
            if netns is not None:
                fd = os.open(netns, os.O_RDONLY | os.O_CLOEXEC)
                try:
                    check(libc.setns(fd, CLONE_NEWNET), f"joining network namespace {netns}")
                finally:
                    os.close(fd)
            work()
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=run, name="netns")
    thread.start()
    thread.join()
    if failure:
        raise failure[0]


def _disable_ipv6(link: str) -> None:
    conf = Path(f"/proc/sys/net/ipv6/conf/{link}/disable_ipv6")
    if conf.exists():  # absent when the host runs without IPv6
        conf.write_text("1")


RECLAIM_WAIT_S = 5.0
"""How long `reclaim` waits for the kernel to finish removing a leftover veth (tens of ms)."""


def reclaim(node: str, sandbox_id: str) -> None:
    """Remove what is left of the network of a sandbox whose tasks are gone (one its agent lost
    track of): its netns, and now, not in the kernel's background, its veth with the /32 route
    through it, so that its address is free for the next sandbox given it."""
    destroy(node, sandbox_id)
    revoke_egress(node, sandbox_id)
    link = Path(f"/sys/class/net/{veth_name(node, sandbox_id)}")
    if link.exists():
        with suppress(FailedPrecondition), netlink.Route() as route:  # gone meanwhile
            route.delete_link(link.name)
    # A delete that met the kernel's own removal of the netns fails while the link is still on
    # its way out: wait for it, so that the address is free on return.
    deadline = time.monotonic() + RECLAIM_WAIT_S
    while link.exists() and time.monotonic() < deadline:
        time.sleep(0.01)


def destroy(node: str, sandbox_id: str) -> None:
    """Remove the netns, as `ip netns del` would, without its process; absent is fine. Once
    nothing holds it (the sandbox's tasks, their sockets), the kernel removes it, and the veth
    with it, route and all, in the background: 25-60 ms later here, where deleting the veth
    first took 10-23 ms of every teardown (a network-wide synchronisation). Until then the veth
    leads only to what is left of the netns; a sandbox that needs its name or address deletes
    it (`create`)."""
    path = netns_path(node, sandbox_id)
    if path.exists():
        libc.umount2(os.fsencode(path), _MNT_DETACH)
        path.unlink(missing_ok=True)
