"""Webhook targets must be public: no loopback, private, link-local, CGNAT, multicast,
unique-local or metadata addresses. The check runs on the address that is actually
connected to, so a DNS answer that changes between check and connect cannot slip past.
"""

import ipaddress
import socket

from tocsin.errors import PermanentTargetError, TransientTargetError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
MAX_NAME_CHARS = 253  # RFC 1035's limits, on the name as DNS carries it (IDNA-encoded)
MAX_LABEL_CHARS = 63
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


def dns_name_problem(host: str) -> str | None:
    """Why `host` cannot be a DNS name, or None. Python's resolver raises UnicodeError, not
    a resolver error, for an empty label or one over 63 characters: caught at submit, such
    a host never reaches a send."""
    name = host.removesuffix(".")
    try:
        encoded = name.encode("idna")
    except UnicodeError:
        return "is not a DNS name (an empty label, or a label over 63 characters)"
    if len(encoded) > MAX_NAME_CHARS:
        return f"is over {MAX_NAME_CHARS} characters"
    if any(not 0 < len(label) <= MAX_LABEL_CHARS for label in encoded.split(b".")):
        return "is not a DNS name (an empty label, or a label over 63 characters)"
    return None


def resolve(host: str, port: int, *, allow_internal: bool) -> str:
    """Resolve `host` to one address to connect to; every answer must be public unless
    allowed. A resolver that answers "try again" (EAI_AGAIN) is a transient failure; a
    name that does not exist is a permanent one."""
    try:
        answers = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as error:
        failure = TransientTargetError if error.errno == socket.EAI_AGAIN else PermanentTargetError
        raise failure(f"cannot resolve webhook host {host!r}: {error}") from error
    addresses = [ipaddress.ip_address(info[4][0]) for info in answers]
    if not allow_internal:
        internal = [str(a) for a in addresses if not is_public(a)]
        if internal:
            raise PermanentTargetError(
                f"webhook host {host!r} resolves to internal address {internal[0]}"
            )
    return str(addresses[0])
