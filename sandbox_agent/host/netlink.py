"""Route netlink requests, as `ip link/addr/route` sends them, from the calling thread's netns.

A restore wires its sandbox's network on the way to CRIU: three `ip` processes took 11-15 ms of
it. pyroute2 encodes the messages; they go over a socket of this module's, one request at a
time, each acknowledged. (pyroute2's own `IPRoute` sends them through an event loop: 0.4 ms a
request and 1-2 ms to open, where one here takes about 0.1 ms.)

A netlink socket belongs to the netns of the thread that opened it, for its whole life.
"""

from __future__ import annotations

import errno
import os
import socket
import struct
from types import TracebackType
from typing import Any

from pyroute2.netlink import NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REQUEST, nlmsg_base
from pyroute2.netlink.rtnl import RTM_DELLINK, RTM_NEWADDR, RTM_NEWLINK, RTM_NEWROUTE
from pyroute2.netlink.rtnl.ifaddrmsg import ifaddrmsg
from pyroute2.netlink.rtnl.ifinfmsg import IFF_UP, ifinfmsg
from pyroute2.netlink.rtnl.rtmsg import rtmsg

from sandbox_agent.errors import FailedPrecondition

_NLMSG_ERROR = 2
_HEADER = struct.Struct("=IHHII")  # struct nlmsghdr: length, type, flags, sequence, port
_ERROR = struct.Struct("=i")  # struct nlmsgerr's error, after the header
_RT_TABLE_MAIN, _RTPROT_BOOT, _RTN_UNICAST = 254, 3, 1
_RT_SCOPE_UNIVERSE, _RT_SCOPE_LINK = 0, 253


class Route:
    """One route netlink socket, in the netns of the thread that makes it; use as a context manager."""

    def __init__(self) -> None:
        self._sock = socket.socket(
            socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, socket.NETLINK_ROUTE
        )
        self._sock.bind((0, 0))
        self._sequence = 0

    def __enter__(self) -> Route:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._sock.close()

    def _request(self, message: nlmsg_base, kind: int, flags: int, what: str) -> None:
        """Send one request and wait for its acknowledgement; FailedPrecondition naming `what` and
        the kernel's error if it is refused."""
        self._sequence += 1
        message["header"]["type"] = kind
        message["header"]["flags"] = NLM_F_REQUEST | NLM_F_ACK | flags
        message["header"]["sequence_number"] = self._sequence
        message.encode()
        self._sock.send(message.data)
        while True:
            reply = self._sock.recv(65536)
            offset = 0
            while offset + _HEADER.size <= len(reply):
                length, reply_kind, _flags, sequence, _port = _HEADER.unpack_from(reply, offset)
                if reply_kind == _NLMSG_ERROR and sequence == self._sequence:
                    (error,) = _ERROR.unpack_from(reply, offset + _HEADER.size)
                    if error:
                        raise FailedPrecondition(
                            f"{what}: {os.strerror(-error)} ({errno.errorcode.get(-error, -error)})"
                        )
                    return
                offset += (max(length, _HEADER.size) + 3) & ~3  # NLMSG_ALIGN

    def add_veth(self, name: str, peer: str, peer_netns: int, mtu: int) -> None:
        """A veth pair: `name` here, `peer` made straight in the netns `peer_netns` (a descriptor)."""
        link = ifinfmsg()
        link["attrs"] = [
            ("IFLA_IFNAME", name),
            ("IFLA_MTU", mtu),
            ("IFLA_LINKINFO", {"attrs": [
                ("IFLA_INFO_KIND", "veth"),
                ("IFLA_INFO_DATA", {"attrs": [
                    ("VETH_INFO_PEER", {"attrs": [("IFLA_IFNAME", peer), ("IFLA_MTU", mtu), ("IFLA_NET_NS_FD", peer_netns)]}),
                ]}),
            ]}),
        ]  # fmt: skip
        self._request(link, RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, f"making veth {name} with peer {peer}")

    def up(self, name: str) -> None:
        link = ifinfmsg()
        link["index"] = _index(name)
        link["flags"] = link["change"] = IFF_UP
        self._request(link, RTM_NEWLINK, 0, f"setting link {name} up")

    def delete_link(self, name: str) -> None:
        link = ifinfmsg()
        link["index"] = _index(name)
        self._request(link, RTM_DELLINK, 0, f"deleting link {name}")

    def add_address(self, name: str, address: str, prefix: int) -> None:
        """`ip addr add address/prefix dev name`."""
        message = ifaddrmsg()
        message["family"] = socket.AF_INET
        message["prefixlen"] = prefix
        message["index"] = _index(name)
        message["attrs"] = [("IFA_LOCAL", address), ("IFA_ADDRESS", address)]
        self._request(
            message, RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL, f"adding address {address}/{prefix} to {name}"
        )

    def add_route(self, name: str, destination: str, prefix: int, gateway: str = "") -> None:
        """`ip route add destination/prefix [via gateway] dev name`: in the main table, on the link
        itself without a gateway."""
        message = rtmsg()
        fields: dict[str, Any] = {
            "family": socket.AF_INET, "dst_len": prefix, "table": _RT_TABLE_MAIN, "proto": _RTPROT_BOOT,
            "type": _RTN_UNICAST, "scope": _RT_SCOPE_UNIVERSE if gateway else _RT_SCOPE_LINK,
        }  # fmt: skip
        for key, value in fields.items():
            message[key] = value
        attrs: list[tuple[str, Any]] = [("RTA_OIF", _index(name))]
        if prefix:
            attrs.append(("RTA_DST", destination))
        if gateway:
            attrs.append(("RTA_GATEWAY", gateway))
        message["attrs"] = attrs
        via = f" via {gateway}" if gateway else ""
        self._request(
            message,
            RTM_NEWROUTE,
            NLM_F_CREATE | NLM_F_EXCL,
            f"adding route {destination}/{prefix}{via} dev {name}",
        )


def _index(name: str) -> int:
    """The index of link `name` in the calling thread's netns."""
    try:
        return socket.if_nametoindex(name)
    except OSError:
        raise FailedPrecondition(f"there is no link {name}") from None
