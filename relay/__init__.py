"""The events relay, a program of its own beside the nodes (``python -m gateway
events``, ``relay.webhook``): consumes ``{IM_NAMESPACE}.events`` from RabbitMQ
and POSTs each event, signed, to a webhook. It reuses router's AMQP helpers
(``router.amqp_urls``, ``router.amqp_link``: the URL list and its round-robin
reconnect); router never imports it."""
