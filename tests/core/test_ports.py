"""core.ports: ports for servers that are told their port before they bind it."""

from __future__ import annotations

import socket
from pathlib import Path

from modelward.core.ports import free_ports


def test_ports_are_distinct_bindable_and_never_ones_the_kernel_hands_to_outgoing_connections() -> None:
    ports = free_ports(5)
    assert len(set(ports)) == 5
    rng = Path("/proc/sys/net/ipv4/ip_local_port_range")
    if rng.is_file():  # Linux: below the ephemeral range, where no connect() gets a local port by itself
        lo = int(rng.read_text().split()[0])
        assert all(p < lo for p in ports), (ports, lo)
    for p in ports:  # free when chosen: a server can listen there
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", p))
            s.listen(1)
