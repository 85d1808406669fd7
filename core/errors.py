"""Errors of the pure layer. ``Unavailable`` means nothing was stored: safe to retry."""

from __future__ import annotations

__all__ = ["Unavailable"]


class Unavailable(Exception):
    """A dependency (Redis, MongoDB) did not answer, or the node is overloaded."""

    def __init__(self, dependency: str, detail: str = "") -> None:
        super().__init__(f"{dependency} unavailable{': ' + detail if detail else ''}")
        self.dependency = dependency
