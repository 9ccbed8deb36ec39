"""Free TCP ports for servers that must be told their port before they start (a subprocess's ``--port``, an
address written into a consortium file, the parties of an MPC run).

The usual recipe, binding port 0 and closing the socket, hands out a port from the kernel's ephemeral range
(``net.ipv4.ip_local_port_range``): until the server binds it, any outgoing connection on the machine (a gRPC
client, a test worker's HTTP request) may get the same port as its local end, and the server then fails with
"Address already in use". :func:`free_ports` picks below that range instead, where the kernel never assigns a
port by itself, so only another explicit choice can take it; it checks each port free when choosing it.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST = 10000  # below: well-known services' ports live there


def _below_ephemeral() -> tuple[int, int] | None:
    """The ports below the kernel's ephemeral range, or None where it is not known (not Linux) or too small."""
    try:
        lo = int(_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return (_LOWEST, lo - 1) if lo - 1 - _LOWEST >= 1000 else None


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a TIME_WAIT remnant does not stop a server
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_ports(k: int, host: str = "127.0.0.1") -> list[int]:
    """``k`` distinct TCP ports on ``host`` that are free now and that the kernel does not hand out by itself.

    Args:
        k: how many.
        host: the address the servers will listen on.

    Returns:
        The ports (below the ephemeral range on Linux; elsewhere ports the OS chose, held open together so that
        they differ).

    Example:
        >>> alice, bob = free_ports(2)
    """
    span = _below_ephemeral()
    if span is not None:
        rng = random.Random()  # the caller's seeded global RNG is neither used nor advanced (reproducible runs)
        chosen: list[int] = []
        for _ in range(200 * k):
            p = rng.randint(*span)
            if p not in chosen and _bindable(host, p):
                chosen.append(p)
                if len(chosen) == k:
                    return chosen
    socks = []
    try:
        for _ in range(k):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port(host: str = "127.0.0.1") -> int:
    """One port of :func:`free_ports`.

    Example:
        >>> port = free_port()
    """
    return free_ports(1, host)[0]
