"""Devices and the login policy, pure.

A connection names its device (``?device=ID&platform=P`` on the handshake; a
node assigns an id when none is given) and a platform. The login policy maps
each device to a *slot*: a new connection takes its slot from whatever
connection of the same user held it, on any node, and that one is closed
with 4005 "replaced". The same device always has a slot of its own too, so a
device reconnecting replaces its own stale connection under every policy.

- ``unlimited``: each device its own slot (only the same device replaces).
- ``one_per_platform``: one slot per platform.
- ``one_mobile``: as ``one_per_platform``, with ``ios`` and ``android``
  sharing the slot ``mobile``.
"""

from __future__ import annotations

import re

__all__ = ["PLATFORMS", "POLICIES", "REPLACED", "DeviceError", "check_device", "slot"]

PLATFORMS = ("ios", "android", "web", "desktop", "other")
POLICIES = ("unlimited", "one_per_platform", "one_mobile")
MOBILE = frozenset({"ios", "android"})
REPLACED = 4005  # the close code of a connection another one of its slot replaced
_DEVICE = re.compile(r"[A-Za-z0-9_.:-]{1,64}")


class DeviceError(ValueError):
    """A device id or platform a handshake cannot use (the message says which)."""


def check_device(device: str | None, platform: str | None) -> tuple[str | None, str]:
    """The handshake's device id (None: the node assigns one) and platform
    (``other`` when not given); DeviceError for either malformed."""
    if device is not None and not _DEVICE.fullmatch(device):
        raise DeviceError("device must be 1-64 characters of [A-Za-z0-9_.:-]")
    platform = platform or "other"
    if platform not in PLATFORMS:
        raise DeviceError(f"platform must be one of {', '.join(PLATFORMS)}")
    return device, platform


def slot(policy: str, platform: str, device: str) -> str:
    """The slot a connection of ``device`` on ``platform`` takes under ``policy``."""
    if policy == "one_mobile" and platform in MOBILE:
        return "p:mobile"
    if policy in ("one_per_platform", "one_mobile"):
        return f"p:{platform}"
    return f"d:{device}"
