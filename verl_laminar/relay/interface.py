"""Which local address a relay binds: ``laminar.relay.interface`` names a NIC (``ib0``, ``eth1``) or an address.

On clusters the fast network is often not the one Ray's node address is on; the relay has to bind the NIC the
user means (the address is resolved on the relay's own node, where that NIC lives).
"""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct

_SIOCGIFADDR = 0x8915


class InterfaceError(ValueError):
    """``laminar.relay.interface`` names no interface with an IPv4 address on this node."""


def interface_address(name: str) -> str:
    """The IPv4 address of interface ``name``, or ``name`` itself when it already is an address."""
    try:
        return str(ipaddress.IPv4Address(name))
    except ValueError:
        pass
    names = sorted(n for _, n in socket.if_nameindex())
    if name not in names:
        raise InterfaceError(f"laminar.relay.interface={name!r}: no such network interface on {socket.gethostname()}; "
                             f"it has {names} (or give an IPv4 address)")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
        except OSError as e:
            raise InterfaceError(f"laminar.relay.interface={name!r} has no IPv4 address on "
                                 f"{socket.gethostname()} ({e}); give the address to bind instead") from e
    return socket.inet_ntoa(packed[20:24])
