"""The HTTP API: the user API, the server API, their models, guard and routes.

Never imports the WebSocket wing (``gateway.ws``); both push through
``gateway.delivery``."""
