"""Which process holds the server end of a TCP connection on loopback, read from /proc.

No route of the server can tell which front-end process answered it, and two requests on one
kept-alive connection always reach the same process; so a test learns the owner of a client's
connection from the kernel: the connection's two ports in /proc/net/tcp{,6} give the socket
inode of its server end, and the process whose /proc/<pid>/fd links to that inode holds it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

ESTABLISHED = "01"  # the state column of /proc/net/tcp


@dataclass(frozen=True)
class TcpEnd:
    """One socket of an established TCP connection: its port, its peer's port, its inode."""

    local_port: int
    remote_port: int
    inode: int


def _port(address: str) -> int:
    return int(address.rsplit(":", 1)[1], 16)  # "0100007F:1F90" -> 8080


def established_ends() -> list[TcpEnd]:
    """Every established TCP socket of this network namespace, IPv4 and IPv6."""
    ends = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(table):
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == ESTABLISHED:
                ends.append(TcpEnd(_port(fields[1]), _port(fields[2]), int(fields[9])))
    return ends


def socket_inodes(pid: int) -> set[int]:
    """The inodes of the sockets process `pid` holds open; empty once it is gone."""
    inodes = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except (FileNotFoundError, ProcessLookupError):
        return inodes
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            inodes.add(int(target[len("socket:["):-1]))
    return inodes


def own_client_ports(server_port: int) -> set[int]:
    """The local ports of this process's connections to `server_port`."""
    mine = socket_inodes(os.getpid())
    return {end.local_port for end in established_ends()
            if end.remote_port == server_port and end.inode in mine}


def owner_of(server_port: int, client_port: int, pids: list[int]) -> int | None:
    """Which of `pids` holds the server end of the connection from `client_port` to
    `server_port`; None when none of them does (or the connection is gone)."""
    inodes = {end.inode for end in established_ends()
              if end.local_port == server_port and end.remote_port == client_port}
    holders = [pid for pid in pids if inodes & socket_inodes(pid)]
    if len(holders) > 1:
        raise AssertionError(f"processes {holders} all hold the connection from {client_port}")
    return holders[0] if holders else None
