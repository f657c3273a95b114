"""Who listens on a TCP port, from the kernel's socket tables (/proc/net/tcp, tcp6)."""

from __future__ import annotations

import socket
from dataclasses import dataclass


@dataclass(frozen=True)
class Listener:
    addr: str  # the table's local address, hex as the kernel writes it
    port: int
    uid: int
    inode: int


def listeners(table: str, port: int | None = None, addr: str | None = None) -> list[Listener]:
    """The sockets in ``table`` (a /proc/net/tcp or tcp6 text) listening on ``port`` (None: any) and IPv4 ``addr``
    (None: any)."""
    want = socket.inet_aton(addr)[::-1].hex().upper() if addr else None
    found = []
    for line in table.splitlines()[1:]:
        fields = line.split()
        local, local_port = fields[1].rsplit(":", 1)
        if fields[3] == "0A" and port in (None, int(local_port, 16)) and want in (None, local):  # 0A: LISTEN
            found.append(Listener(local, int(local_port, 16), int(fields[7]), int(fields[9])))
    return found
