"""The caller's devices (``GET /v1/devices``) and, on the server API, a user's
devices and the disconnect of one (``gateway.presence.devices``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from fastapi import FastAPI
from pydantic import BaseModel, Field

from gateway.http.common import JSON, READ, User, ok
from gateway.http.models import Id, Ok, UserId
from gateway.presence.devices import Devices

__all__ = ["install_devices", "install_server_devices"]


class Device(BaseModel):
    device: str
    platform: Literal["ios", "android", "web", "desktop", "other"]
    since: int = Field(description="unix ms it connected")


class DeviceList(BaseModel):
    devices: list[Device] = Field(description="connected devices on every live node, "
                                  "oldest first")


def install_devices(app: FastAPI, devices: Devices) -> None:
    @app.get("/v1/devices", response_model=DeviceList, responses=READ)
    async def my_devices(user: User) -> JSON:
        """The caller's connected devices, on every node (the login policy:
        ``IM_LOGIN_POLICY``)."""
        return JSON({"devices": await devices.devices(user)})


def install_server_devices(app: FastAPI, devices: Devices, key: Sequence[Any],
                           responses: dict[int | str, dict[str, Any]]) -> None:
    @app.get("/v1/server/users/{user}/devices", response_model=DeviceList,
             responses=responses, dependencies=key)
    async def user_devices(user: UserId) -> JSON:
        """A user's connected devices, on every node."""
        return JSON({"devices": await devices.devices(user)})

    @app.post("/v1/server/users/{user}/devices/{device}/disconnect", response_model=Ok,
              responses=responses, dependencies=key)
    async def disconnect_device(user: UserId, device: Id) -> JSON:
        """That device's connection, on whichever node, is closed with 4003 (the
        device may connect again: to keep it out, ban or revoke)."""
        await devices.disconnect_device(user, device)
        return ok()
