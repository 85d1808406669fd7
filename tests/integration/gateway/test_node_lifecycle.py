"""A node's start and stop as an operator sees them: a port in use is one line
naming the port and its setting (and what had started is stopped again); a
SIGTERM-style drain says how many connections it drains, then "stopped"."""

from __future__ import annotations

import logging
import socket

import pytest

from gateway.node import StartupError
from tests.conftest import uid


@pytest.mark.parametrize("setting", ["ws_port", "http_port", "metrics_port"])
async def test_a_port_in_use_is_one_line_naming_it_and_its_setting(make_node, setting):
    with socket.create_server(("127.0.0.1", 0)) as held:
        port = held.getsockname()[1]
        with pytest.raises(StartupError) as refused:
            await make_node(**{setting: port})
    assert str(refused.value) == (
        f"cannot listen on 127.0.0.1:{port} (IM_{setting.upper()}): in use; set "
        f"IM_{setting.upper()} to a free port (0: any free one)")
    # What had started (lease, broker, stores) was stopped: the next node starts.
    node = await make_node()
    assert await node.healthy()


async def test_a_drain_logs_its_connections_and_its_end(make_node, connect, caplog):
    node = await make_node()
    await connect(node, uid("a"))
    await connect(node, uid("b"))
    with caplog.at_level(logging.INFO, logger="gateway.node"):
        await node.drain()
    lines = [r.getMessage() for r in caplog.records if r.name == "gateway.node"]
    assert lines[0].startswith("draining 2 connections") and lines[-1] == "stopped"
