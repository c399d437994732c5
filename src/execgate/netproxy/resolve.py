"""Names to addresses, at the proxy only, and which addresses are internal.

The proxy resolves a name once and connects to exactly the addresses it checked (no second
lookup a rebinding DNS server could answer differently). A hosts file, when configured
(``network.hosts_file``), is consulted first: tests point names at servers on loopback.
"""

from __future__ import annotations

import ipaddress
import socket
from pathlib import Path

import anyio

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class ResolveError(Exception):
    """The name has no address."""


def literal(host: str) -> IPAddress | None:
    """``host`` as an IP address if it is one."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


#: IPv6 prefixes whose addresses carry an IPv4 address in their last 32 bits, which a
#: translator or the kernel may deliver to: IPv4-compatible (``::a.b.c.d``), SIIT
#: (``::ffff:0:a.b.c.d``), NAT64 (``64:ff9b::/96``, local-use ``64:ff9b:1::/48``).
_EMBEDDING_V4 = tuple(
    ipaddress.IPv6Network(n) for n in ("::/96", "::ffff:0:0:0/96", "64:ff9b::/96", "64:ff9b:1::/48")
)


def embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address carries (mapped, compatible, SIIT, NAT64, 6to4,
    Teredo's client), if any."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    if any(address in net for net in _EMBEDDING_V4):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def is_internal(address: IPAddress) -> bool:
    """Loopback, link-local, private, unspecified, multicast, reserved: anything that is not
    a public unicast address. An IPv6 address that carries an IPv4 address is judged as that
    IPv4 address as well (the same answer on every Python: their tables differ)."""
    if isinstance(address, ipaddress.IPv6Address):
        inner = embedded_ipv4(address)
        if inner is not None and is_internal(inner):
            return True
    return not address.is_global or address.is_multicast


def read_hosts_file(path: Path) -> dict[str, list[IPAddress]]:
    """``/etc/hosts`` syntax: ADDRESS NAME [ALIAS…], ``#`` comments."""
    table: dict[str, list[IPAddress]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        words = line.partition("#")[0].split()
        if len(words) < 2:
            continue
        address = literal(words[0])
        if address is None:
            continue
        for name in words[1:]:
            table.setdefault(name.rstrip(".").lower(), []).append(address)
    return table


class Resolver:
    def __init__(self, hosts_file: Path | None = None) -> None:
        self.hosts_file = hosts_file

    async def resolve(self, host: str, port: int) -> list[IPAddress]:
        """Every address of ``host`` (normalised), IPv4 first; :class:`ResolveError` if none."""
        address = literal(host)
        if address is not None:
            return [address]
        if self.hosts_file is not None:
            try:
                table = read_hosts_file(self.hosts_file)
            except OSError as exc:
                raise ResolveError(f"cannot read {self.hosts_file}: {exc.strerror}") from None
            if host in table:
                return table[host]
        try:
            infos = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise ResolveError(f"{host}: {exc.strerror or exc}") from None
        found: list[IPAddress] = []
        for family, _, _, _, sockaddr in infos:
            if family in (socket.AF_INET, socket.AF_INET6):
                address = ipaddress.ip_address(str(sockaddr[0]).partition("%")[0])
                if address not in found:
                    found.append(address)
        if not found:
            raise ResolveError(f"{host} has no address")
        return sorted(found, key=lambda a: a.version)
