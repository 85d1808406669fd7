"""Router errors."""

from __future__ import annotations

__all__ = ["BrokerUnavailable"]


class BrokerUnavailable(Exception):
    """The broker did not take a publish; the message stays in the offline store."""
