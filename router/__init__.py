"""Where a message goes between gateway nodes: 1:1 pushes to the nodes holding
the receiver's devices, and group, room and presence traffic to every node
bound to its routing key; delivery to this node's own devices the same way
for all of them (``router.router``). Also the controls between nodes, room
positions, the envelope format and the brokers.

``make_broker`` picks the implementation by name, so the gateway never
imports aio-pika.
"""

from __future__ import annotations

from router.base import Broker, BrokerStatus
from router.broker_memory import MemoryBroker
from router.errors import BrokerUnavailable
from router.router import Router

__all__ = ["Broker", "BrokerStatus", "BrokerUnavailable", "MemoryBroker", "Router", "make_broker"]


def make_broker(kind: str, url: str, namespace: str) -> Broker:
    """``rabbitmq`` (between nodes; ``url`` is IM_AMQP_URL, one AMQP URL or a
    comma-separated list of a cluster's nodes) or ``memory`` (a single node)."""
    if kind == "rabbitmq":
        from router.broker_rabbitmq import RabbitMQBroker

        return RabbitMQBroker(url, namespace)
    if kind == "memory":
        return MemoryBroker()
    raise ValueError(f"unknown broker {kind!r} (rabbitmq or memory)")
