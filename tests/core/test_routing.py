"""Broker routing keys: built and parsed in one place, and they round trip."""

from __future__ import annotations

import pytest

from gateway.groups.hub import group_key as reexported
from router.routing import group_key, parse_key, room_key


@pytest.mark.parametrize("ident", ["r", "room.1", "a:b-c_d", "g", "g1"])
def test_keys_round_trip(ident):
    assert parse_key(room_key(ident)) == ("room", ident)
    assert parse_key(group_key(ident)) == ("group", ident)


def test_key_shapes_are_the_ones_bound_on_the_broker():
    assert room_key("lobby") == "lobby"  # a room's key is its id
    assert group_key("G7") == "g|G7"
    assert room_key("g1") != group_key("1")  # `|` is in no id: no collision
    assert reexported is group_key
