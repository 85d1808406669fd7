"""One test kit for the tests and the benchmarks.

Everything here talks to real servers on 127.0.0.1 and bounds every wait:

- ``nodes``: gateway nodes as processes (``NodeProcess``).
- ``servers``: private Redis / SecantusDB servers a test may kill (``PrivateServer``),
  ``free_port``, ``free_port_base`` (a block of free ports), ``wait_port``.
- ``clusters``: private local Redis Cluster / RabbitMQ (cluster) on free ports
  (``LocalRedisCluster``, ``LocalRabbit``).
- ``device``: one WebSocket client (``Device``).
- ``lean``: a lean WebSocket for load, thousands per process (``LeanSocket``).
- ``http``: one user on the HTTP API (``HttpUser``; ``HttpUsers`` share a client).
- ``probe``: a Prometheus sample, a process's RSS (``sample``, ``rss_kb``).
- ``tokens``: ``issue_token``.
- ``namespace``: a fresh namespace, and dropping one.
- ``soak``: the chat soak with failover clients (``Soak``).
- ``poll``: ``until``, ``bounded``.
- ``proxy``: a TCP proxy that cuts and slows a link (``TcpProxy``).
"""
