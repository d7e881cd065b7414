"""The TCP sockets this process listens on, read from /proc (Linux; nothing elsewhere): how
status tells which of gloo's listeners, one per process group, are still open."""

from __future__ import annotations

import ipaddress
import os
import sys


def listening_sockets() -> dict[str, str]:
    """inode -> "host:port" of the TCP sockets this process listens on (Linux; {} elsewhere)."""
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return {}
    inodes = set()
    for fd in fds:
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed meanwhile (the listdir's own fd)
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 9 and fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                found[fields[9]] = _address(fields[1])
    return found


def _address(hex_address: str) -> str:
    host, port = hex_address.split(":")
    raw = bytes.fromhex(host)
    if sys.byteorder == "little":  # the kernel prints each 32-bit word in host order
        raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    ip = ipaddress.ip_address(raw)
    return f"{ip}:{int(port, 16)}" if ip.version == 4 else f"[{ip}]:{int(port, 16)}"
