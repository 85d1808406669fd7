"""Client addresses and the per-address limits (``core.client_ip``): no server."""

from __future__ import annotations

import pytest

from core.client_ip import IpLimits, Proxies, client_ip

PROXIES = Proxies.parse("10.0.0.0/8, 192.168.1.5")


def test_the_peer_counts_unless_it_is_a_trusted_proxy() -> None:
    assert client_ip("203.0.113.9", "1.2.3.4", PROXIES) == "203.0.113.9"  # forged header
    assert client_ip("10.1.2.3", None, PROXIES) == "10.1.2.3"
    assert client_ip("10.1.2.3", "198.51.100.7", PROXIES) == "198.51.100.7"


def test_forwarded_for_is_read_from_the_right_past_trusted_hops() -> None:
    # A client's own "X-Forwarded-For: 1.2.3.4" arrives as the left-most entry.
    assert client_ip("192.168.1.5", "1.2.3.4, 198.51.100.7, 10.9.9.9", PROXIES) == "198.51.100.7"
    assert client_ip("10.0.0.1", "10.0.0.2, 10.0.0.3", PROXIES) == "10.0.0.2"  # all trusted
    assert client_ip("10.0.0.1", "not-an-ip", PROXIES) == "10.0.0.1"
    assert client_ip("10.0.0.1", "2001:db8::1", PROXIES) == "2001:db8::1"


def test_a_bad_proxy_entry_is_named() -> None:
    with pytest.raises(ValueError, match="'10.0.0.0/33'"):
        Proxies.parse("10.0.0.1, 10.0.0.0/33")
    assert Proxies.parse("").networks == []


def test_handshakes_per_second_and_open_connections_per_address() -> None:
    lim = IpLimits(handshake_rate=2, handshake_burst=3, max_conns=2)
    assert [lim.admit("a", 0.0) for _ in range(4)] == [None, None, None, "handshakes"]
    assert lim.admit("b", 0.0) is None  # another address has its own budget
    assert lim.admit("a", 0.5) is None  # one more token half a second later
    lim.opened("c")
    lim.opened("c")
    assert lim.admit("c", 0.0) == "connections"
    lim.closed("c")
    assert lim.admit("c", 0.0) is None
    lim.closed("c")
    lim.closed("c")  # more closes than opens never go negative
    assert lim.open == {}


def test_zero_turns_each_limit_off() -> None:
    lim = IpLimits(handshake_rate=0, handshake_burst=0, max_conns=0)
    for _ in range(10_000):
        lim.opened("a")
        assert lim.admit("a", 0.0) is None


def test_a_node_refuses_to_start_with_a_bad_trusted_proxy() -> None:
    from gateway.config import ConfigError, Settings
    with pytest.raises(ConfigError, match="IM_TRUSTED_PROXIES: not an address"):
        Settings.from_env({"IM_TRUSTED_PROXIES": "10.0.0.1, proxy.example"})
