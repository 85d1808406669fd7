"""The WebSocket wing: one connection's session (the sans-I/O core and its
asyncio driver), token expiry, and the registry of connects and disconnects.

Never imports the HTTP wing (``gateway.http``)."""
