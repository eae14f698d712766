"""Where the product may send a request of its own (a probe, a webhook): the address guard, which resolves a name once
and refuses non-global addresses (docs/fleet.md, "fleet/addresses.py")."""

import ipaddress
import socket

# Never a serving box or a webhook receiver, whatever the settings say.
METADATA_ADDRESSES = frozenset(ipaddress.ip_address(a) for a in (
    "169.254.169.254",  # AWS, GCP, Azure, OpenStack, DigitalOcean, Oracle
    "169.254.170.2",  # AWS ECS task metadata
    "169.254.169.253",  # AWS DNS
    "169.254.0.23",  # Tencent Cloud
    "100.100.100.200",  # Alibaba Cloud
    "168.63.129.16",  # Azure WireServer (host agent, DNS, health probes): a public address every Azure VM reaches
    "fd00:ec2::254",  # AWS IMDS over IPv6
    "fd00:ec2::253",
))
# IPv6 forms whose last 32 bits are an IPv4 address a host may route to: NAT64 (the well-known and the local-use
# prefix), IPv4-translated (::ffff:0:a.b.c.d) and the deprecated IPv4-compatible (::a.b.c.d).
_LOW_32_CARRIERS = tuple(ipaddress.ip_network(n) for n in ("64:ff9b::/96", "64:ff9b:1::/48", "::ffff:0:0:0/96",
                                                           "::/96"))


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    found = [ip.ipv4_mapped, ip.sixtofour, ip.teredo[1] if ip.teredo else None]
    if any(ip in carrier for carrier in _LOW_32_CARRIERS) and int(ip) > 1:  # not :: or ::1, judged as themselves
        found.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    return [a for a in found if a is not None]


def address_refusal(address: str, *, allow_private: bool) -> str:
    """Why nothing may be sent to this literal address, or "" if it may."""
    try:
        ip = ipaddress.ip_address(address.strip())
    except ValueError:
        return f"{address!r} is not a literal IP address (hostnames are not resolved)"
    # An IPv4 address carried inside an IPv6 one is where the packets go: judge (and name) it first.
    candidates = (_embedded_ipv4(ip) if ip.version == 6 else []) + [ip]
    for candidate in candidates:
        shown = str(candidate) if candidate == ip else f"{candidate} (inside {ip})"
        if candidate in METADATA_ADDRESSES:
            return f"{shown} is a cloud metadata address"
        if candidate.is_unspecified:
            return f"{shown} is the unspecified address"
        if candidate.is_multicast:
            return f"{shown} is a multicast address"
        if allow_private:
            continue
        for kind in ("loopback", "link_local", "site_local", "reserved", "private"):
            if getattr(candidate, f"is_{kind}", False):  # site-local: IPv6 only, and not private to every Python
                return f"{shown} is a {kind.replace('_', '-')} address"
        if not candidate.is_global:
            return f"{shown} is not a public address"
    return ""


def resolve(host: str, port: int) -> list[str]:
    """Every address a host name (or literal IP) stands for; raises OSError when it resolves to nothing."""
    host = host.strip("[]")
    try:
        return [str(ipaddress.ip_address(host))]
    except ValueError:
        pass
    found = []
    for *_, sockaddr in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
        address = str(ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0]))
        if address not in found:
            found.append(address)
    if not found:
        raise OSError(f"{host} resolves to no address")
    return found


def host_refusal(host: str, addresses: list[str], *, allow_private: bool) -> str:
    """Why a host may not be reached at these addresses, or "": every one of them must be allowed (a name that also
    points at a private address would let the next resolution pick it)."""
    for address in addresses:
        why = address_refusal(address, allow_private=allow_private)
        if why:
            return why if address == host.strip("[]") else f"{host} resolves to {why}"
    return ""
