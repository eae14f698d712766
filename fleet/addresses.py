"""Where the product may send a request of its own (a probe, a webhook): the address guard, which resolves a name once
and refuses non-global addresses (docs/fleet.md, "fleet/addresses.py")."""

import ipaddress
import socket

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Table = tuple[tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, str], ...]

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
# Refused even where private addresses are allowed: no one host answers these.
_NEVER = (("unspecified", ("0.0.0.0/32", "::/128")), ("multicast", ("224.0.0.0/4", "ff00::/8")))
# The guard's own table of special-purpose ranges (IANA's IPv4 and IPv6 special-purpose address registries, the
# unallocated IPv6 space), first match names the kind: the interpreter's tables differ across Python versions
# (3.11.7 lets 192.0.0.8 through). Whole blocks where the registry excepts a few sub-blocks (192.0.0.0/24,
# 2001::/23): nothing a box or a receiver lives at.
_SPECIAL = (
    ("loopback", ("127.0.0.0/8", "::1/128")),
    ("link-local", ("169.254.0.0/16", "fe80::/10")),
    ("site-local", ("fec0::/10",)),
    # 240/4 holds 255.255.255.255. IPv6 outside 2000::/3, fc00::/7 and the prefixes above is unallocated; ::/8 holds
    # ::ffff:0:0/96, 64:ff9b::/96 and 64:ff9b:1::/48 (their IPv4 is judged first as well) and 100::/8 holds 100::/64.
    ("reserved", ("240.0.0.0/4", "::/8", "100::/8", "200::/7", "400::/6", "800::/5", "1000::/4", "4000::/3",
                  "6000::/3", "8000::/3", "a000::/3", "c000::/3", "e000::/4", "f000::/5", "f800::/6", "fe00::/9")),
    ("private", ("0.0.0.0/8", "10.0.0.0/8", "172.16.0.0/12", "192.0.0.0/24", "192.0.2.0/24", "192.168.0.0/16",
                 "198.18.0.0/15", "198.51.100.0/24", "203.0.113.0/24", "2001::/23", "2001:db8::/32", "3fff::/20",
                 "fc00::/7")),
    ("non-public", ("100.64.0.0/10", "192.88.99.0/24")),  # carrier-grade NAT; the retired 6to4 relay anycast
)


def _table(kinds: tuple[tuple[str, tuple[str, ...]], ...]) -> Table:
    return tuple((ipaddress.ip_network(n), kind) for kind, networks in kinds for n in networks)


_NEVER_NETWORKS = _table(_NEVER)
_SPECIAL_NETWORKS = _table(_SPECIAL)
# IPv6 forms whose last 32 bits are an IPv4 address a host may route to: NAT64 (the well-known and the local-use
# prefix), IPv4-translated (::ffff:0:a.b.c.d) and the deprecated IPv4-compatible (::a.b.c.d).
_LOW_32_CARRIERS = tuple(ipaddress.ip_network(n) for n in ("64:ff9b::/96", "64:ff9b:1::/48", "::ffff:0:0:0/96",
                                                           "::/96"))


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    found = [ip.ipv4_mapped, ip.sixtofour, ip.teredo[1] if ip.teredo else None]
    if any(ip in carrier for carrier in _LOW_32_CARRIERS) and int(ip) > 1:  # not :: or ::1, judged as themselves
        found.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    return [a for a in found if a is not None]


def _kind(ip: Address, table: Table) -> str:
    return next((kind for network, kind in table if ip.version == network.version and ip in network), "")


def address_refusal(address: str, *, allow_private: bool) -> str:
    """Why nothing may be sent to this literal address, or "" if it may."""
    try:
        ip = ipaddress.ip_address(address.strip())
    except ValueError:
        return f"{address!r} is not a literal IP address (hostnames are not resolved)"
    # An IPv4 address carried inside an IPv6 one is where the packets go: judge (and name) it first.
    candidates: list[Address] = [*(_embedded_ipv4(ip) if ip.version == 6 else []), ip]
    for candidate in candidates:
        shown = str(candidate) if candidate == ip else f"{candidate} (inside {ip})"
        if candidate in METADATA_ADDRESSES:
            return f"{shown} is a cloud metadata address"
        kind = _kind(candidate, _NEVER_NETWORKS) or ("" if allow_private else _kind(candidate, _SPECIAL_NETWORKS))
        if kind == "unspecified":
            return f"{shown} is the unspecified address"
        if kind == "non-public":
            return f"{shown} is not a public address"
        if kind:
            return f"{shown} is a {kind} address"
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
