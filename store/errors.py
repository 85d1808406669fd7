"""Store errors. ``Unavailable`` (defined with the pure layer, which raises it
too) means nothing was stored: safe to retry."""

from __future__ import annotations

from core.errors import Unavailable

__all__ = ["Unavailable"]
