"""Which network addresses the platform may send a request to on a client's behalf (alert
webhooks, image URLs fetched for a provider): public unicast ones only, so nobody reaches our
own network (loopback, private, link-local, carrier-grade NAT, cloud metadata...) through us.

`ipaddress`'s `is_global` alone is not enough: an IPv6 address can carry an IPv4 one that the
network will route to (IPv4-mapped and -translated, IPv4-compatible, NAT64, 6to4, Teredo),
and `is_global` judges the IPv6 prefix, not the IPv4 inside. Each embedded IPv4 address is
judged as well."""

from __future__ import annotations

import ipaddress

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# IPv4 inside IPv6, by the low 32 bits: IPv4-mapped (::ffff:0:0/96), IPv4-translated
# (::ffff:0:0:0/96, RFC 2765), IPv4-compatible (::/96, deprecated), and NAT64's well-known
# and local-use prefixes (RFC 6052, RFC 8215).
_LOW_32 = tuple(
    ipaddress.ip_network(n)
    for n in ("::ffff:0:0/96", "::ffff:0:0:0/96", "::/96", "64:ff9b::/96", "64:ff9b:1::/48")
)


def address_embedded_ipv4(address: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address stands for, if any."""
    found = []
    if any(address in network for network in _LOW_32) and int(address) > 1:  # not :: or ::1
        found.append(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
    if address.sixtofour is not None:  # 2002:AABB:CCDD::/48
        found.append(address.sixtofour)
    if address.teredo is not None:  # 2001::/32: (server, client)
        found.extend(address.teredo)
    return found


def address_public(address: str | IPAddress) -> bool:
    """Whether a request may go to `address` (a literal; an IPv6 zone is ignored)."""
    if isinstance(address, str):
        address = ipaddress.ip_address(address.split("%", 1)[0])
    if not address.is_global or address.is_multicast:
        return False
    if address.version == 6:
        return all(address_public(inner) for inner in address_embedded_ipv4(address))
    return True


def peer_address(response) -> str | None:
    """The address an httpx response actually came from (its connection's peer), where the
    transport tells it."""
    stream = response.extensions.get("network_stream")
    peer = stream.get_extra_info("server_addr") if stream is not None else None
    return peer[0] if peer else None
