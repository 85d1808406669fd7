"""Store errors. ``Unavailable`` (defined with the pure layer, which raises it
too) means nothing was stored: safe to retry. ``GroupGone``: the group named
no longer exists (dissolved, or never did); nothing was stored."""

from __future__ import annotations

from core.errors import Unavailable

__all__ = ["GroupGone", "Unavailable"]


class GroupGone(Exception):
    """The group is dissolved or unknown: a seq allocation refused it."""
