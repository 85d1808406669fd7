"""The events relay: a program of its own that consumes the node's events
from RabbitMQ and posts them, signed, to a webhook."""
