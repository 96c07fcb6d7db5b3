"""Webhook targets must be public: no loopback, private, link-local, CGNAT, multicast,
unique-local or metadata addresses. The check runs on the address that is actually
connected to, so a DNS answer that changes between check and connect cannot slip past.
"""

import ipaddress
import socket

from tocsin.errors import PermanentTargetError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")


def embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 form carries (mapped, 6to4, NAT64, IPv4-compatible), which
    is where a connection to it ends up. Python calls some of these global whatever the
    address inside, `::127.0.0.1` and `2002:7f00:1::` among them."""
    if address.ipv4_mapped or address.sixtofour:
        return address.ipv4_mapped or address.sixtofour
    if address in NAT64 or address in IPV4_COMPATIBLE:
        return ipaddress.IPv4Address(int(address) & 0xFFFF_FFFF)
    return None


def is_public(address: IPAddress) -> bool:
    """True only for globally routable unicast addresses, judged by the IPv4 address inside
    an IPv6 form that carries one."""
    if isinstance(address, ipaddress.IPv6Address) and (inside := embedded_ipv4(address)):
        return is_public(inside)
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
