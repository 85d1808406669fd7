"""The edge: WebSocket and HTTP, auth, the client protocol, local connection maps."""
