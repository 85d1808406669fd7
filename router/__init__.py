"""Routing between gateway nodes: 1:1 pushes, and later groups, rooms and feeds."""

from router.router import Router

__all__ = ["Router"]
