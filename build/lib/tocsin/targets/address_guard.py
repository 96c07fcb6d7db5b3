"""Webhook targets must be public: no loopback, private, link-local, CGNAT, multicast,
unique-local or metadata addresses. The check runs on the address that is actually
connected to, so a DNS answer that changes between check and connect cannot slip past.
"""

import ipaddress
import socket

from tocsin.errors import PermanentTargetError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def is_public(address: IPAddress) -> bool:
    """True only for globally routable unicast addresses."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        return is_public(address.ipv4_mapped)
    return address.is_global and not address.is_multicast


def literal_address(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def resolve(host: str, port: int, *, allow_internal: bool) -> str:
    """Resolve `host` to one address to connect to; every answer must be public unless allowed."""
    try:
        answers = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as error:
        raise PermanentTargetError(f"cannot resolve webhook host {host!r}: {error}") from error
    addresses = [ipaddress.ip_address(info[4][0]) for info in answers]
    if not allow_internal:
        internal = [str(a) for a in addresses if not is_public(a)]
        if internal:
            raise PermanentTargetError(
                f"webhook host {host!r} resolves to internal address {internal[0]}"
            )
    return str(addresses[0])
