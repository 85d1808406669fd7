"""Per client address limits at the WebSocket edge: the address a connection
comes from, and how many handshakes per second and open connections it may
have. Pure: the caller gives the time.

Behind a proxy every connection comes from the proxy: ``X-Forwarded-For`` is
believed only when the peer is one of the trusted proxies, and then read
from the right, skipping trusted hops, so a client cannot pick the address
it is counted under by sending the header itself.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from core.ratelimit import KeyedBuckets

__all__ = ["IpLimits", "Proxies", "client_ip"]

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class Proxies:
    """Trusted proxies: addresses or CIDR blocks (``IM_TRUSTED_PROXIES``)."""

    def __init__(self, specs: Iterable[str] = ()) -> None:
        self.networks: list[Network] = [ipaddress.ip_network(s.strip(), strict=False)
                                        for s in specs if s.strip()]

    @classmethod
    def parse(cls, value: str) -> Proxies:
        """From a comma-separated list; ValueError names a bad entry."""
        specs = [s for s in value.split(",") if s.strip()]
        for s in specs:
            try:
                ipaddress.ip_network(s.strip(), strict=False)
            except ValueError:
                raise ValueError(f"not an address or CIDR block: {s.strip()!r}") from None
        return cls(specs)

    def trusts(self, address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        return any(ip in n for n in self.networks)


def client_ip(peer: str, forwarded_for: str | None, proxies: Proxies) -> str:
    """The address a connection is counted under: ``peer``, or, when ``peer``
    is a trusted proxy, the right-most address of ``X-Forwarded-For`` that is
    not itself a trusted proxy."""
    if not forwarded_for or not proxies.trusts(peer):
        return peer
    hops = [h.strip() for h in forwarded_for.split(",") if h.strip()]
    for hop in reversed(hops):
        if not proxies.trusts(hop):
            try:
                return str(ipaddress.ip_address(hop))
            except ValueError:
                return peer  # garbage in the header: count the proxy itself
    return hops[0] if hops else peer


class IpLimits:
    """Handshakes per second (a token bucket per address, bounded like the
    per-user ones) and open connections per address; 0 turns a limit off."""

    def __init__(self, handshake_rate: float, handshake_burst: int, max_conns: int) -> None:
        self.handshakes = KeyedBuckets(handshake_rate, handshake_burst)
        self.max_conns = max_conns
        self.open: dict[str, int] = {}

    def admit(self, ip: str, now: float) -> str | None:
        """None if a new connection from ``ip`` may go on, else which limit
        refused it (``handshakes`` or ``connections``)."""
        if not self.handshakes.take(ip, now):
            return "handshakes"
        if self.max_conns > 0 and self.open.get(ip, 0) >= self.max_conns:
            return "connections"
        return None

    def opened(self, ip: str) -> None:
        self.open[ip] = self.open.get(ip, 0) + 1

    def closed(self, ip: str) -> None:
        n = self.open.get(ip, 0) - 1
        if n > 0:
            self.open[ip] = n
        else:
            self.open.pop(ip, None)
