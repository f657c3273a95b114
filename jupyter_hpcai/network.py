"""Which address and interface a rank talks on: derived from its node's Slurm address, never fixed strings.

On a real site the nodes reach each other on one network (Ethernet, IPoIB) and each node's NodeAddr in
Slurm is its address there. Every library that opens sockets between ranks is pointed at the interface
holding that address: Open MPI's TCP transport, Horovod's Gloo, torch.distributed's Gloo and NCCL's
bootstrap. What a site or the user already set is kept.
"""

from __future__ import annotations

import fcntl
import socket
import struct
from collections.abc import Mapping, MutableMapping

from .scheduler import chosen

environment = chosen().environment

LOOPBACK = "127.0.0.1"
NODE_ADDRS = "HPCAI_NODE_ADDRS"  # "n1=10.0.0.1,n2=10.0.0.2": every node of the step, set by the launcher
_SIOCGIFADDR = 0x8915


def interface_of(address: str) -> str | None:
    """The name of this host's interface holding IPv4 ``address`` (``lo`` for loopback), or None."""
    if address.startswith("127."):
        return "lo"
    for _, name in socket.if_nameindex():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                packed = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:  # no IPv4 address on this interface
                continue
        if socket.inet_ntoa(packed[20:24]) == address:
            return name
    return None


def source_address(destination: str) -> str:
    """This host's address on its route to ``destination`` (an address or a host name): the local end of a UDP
    socket connected there. Connecting a UDP socket only chooses the route; it sends nothing."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((destination, 9))
        return str(s.getsockname()[0])


def encode_addresses(addresses: Mapping[str, str]) -> str:
    return ",".join(f"{node}={addr}" for node, addr in addresses.items())


def decode_addresses(text: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in text.split(",") if "=" in item)


def node_address(env: Mapping[str, str]) -> str:
    """This rank's node address: its entry in HPCAI_NODE_ADDRS (by its node's name), else loopback."""
    return decode_addresses(env.get(NODE_ADDRS, "")).get(env.get(environment.NODE_NAME, ""), LOOPBACK)


def join_node_network(env: MutableMapping[str, str]) -> str:
    """On a rank: record this node's address (HPCAI_NODE_ADDR) and point every transport at its interface."""
    env["HPCAI_NODE_ADDR"] = address = node_address(env)
    rank_network(env, interface_of(address))
    return address


def rank_network(env: MutableMapping[str, str], iface: str | None) -> None:
    """Point every inter-rank transport at ``iface`` (this node's interface), keeping what is already set."""
    if not iface:
        return
    for component in ("btl_tcp", "oob_tcp"):  # Open MPI refuses include and exclude together
        if not any(f"OMPI_MCA_{component}_if_{how}" in env for how in ("include", "exclude")):
            env[f"OMPI_MCA_{component}_if_include"] = iface
    for var in ("HOROVOD_GLOO_IFACE", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        env.setdefault(var, iface)
