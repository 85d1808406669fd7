"""The node's lease and heartbeat, kept from a thread of their own (``LeaseKeeper``).

Clients share the node's event loop; one that floods it must not be able to
delay the lease renewal (another node could take the number: duplicate
mids) or the heartbeat (other nodes would treat this one as dead). So both
run on a thread with its own blocking Redis connection, every
``period_s``; the loop only receives the results (``report``). While the
loop is busy the GIL still switches threads every few milliseconds.

Each beat: renew the lease (``lease_renew.lua``; a vanished key, after Redis
lost its data, is taken again with ``SET NX``), then write this node's
heartbeat expiry and read every node's (one pipeline). On a Redis Cluster
the thread has a cluster client of its own (each key is one slot), and each
beat also sets a canary key on every master (``Keys.canary``): one that had
vanished means its master lost its data, and with it the routes of some of
this node's devices (``Beat.lost``), which the lease, on one master, cannot tell.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import redis
from redis.backoff import ExponentialWithJitterBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import NoScriptError, RedisClusterException, RedisError
from redis.retry import Retry

from core.errors import Unavailable
from store.keys import Keys
from store.records import Beat
from store.redis_client import Lua
from store.redis_urls import cluster_seeds

__all__ = ["LeaseKeeperRedis"]

Report = Callable[[Beat | Unavailable], None]


class LeaseKeeperRedis:
    def __init__(self, url: str, keys: Keys, *, name: str, number: int, token: str,
                 lease_ttl_s: int, heartbeat_ttl_s: float, period_s: float,
                 timeout_s: float, cluster: bool = False) -> None:
        self.keys = keys
        self.name = name
        self.number = number
        self.token = token
        self.lease_ttl_s = lease_ttl_s
        self.heartbeat_ttl_s = heartbeat_ttl_s
        self.period_s = period_s
        self._url = url
        self._cluster = cluster
        self._timeout_s = timeout_s
        self._client: redis.Redis | RedisCluster | None = None  # made on the first beat
        self._renew = Lua("lease_renew.lua")
        self._lock = threading.Lock()  # one beat at a time (the thread's, or beat_once's)
        self._canaries: dict[str, str] = {}  # master "host:port" -> canary key on it
        self._canaries_set = False  # written once: from then on a vanished one means a loss
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, report: Report) -> None:
        self._thread = threading.Thread(target=self._run, args=(report,),
                                        name=f"lease-{self.name}", daemon=True)
        self._thread.start()

    def _run(self, report: Report) -> None:
        while not self._stop.wait(self.period_s):
            report(self.beat_once())

    def beat_once(self) -> Beat | Unavailable:
        """One renewal and heartbeat, now (blocking: call it off the loop)."""
        with self._lock:
            try:
                return self._beat()
            except (RedisError, RedisClusterException, OSError) as exc:
                return Unavailable("redis", type(exc).__name__)

    def _redis(self) -> redis.Redis | RedisCluster:
        if self._client is None:
            t = self._timeout_s
            if self._cluster:
                self._client = RedisCluster(
                    startup_nodes=[ClusterNode(h, p)  # type: ignore[no-untyped-call]
                                   for h, p in cluster_seeds(self._url)],
                    socket_timeout=t, socket_connect_timeout=t,
                    retry=Retry(ExponentialWithJitterBackoff(base=0.05, cap=0.5), 2))
            else:
                self._client = redis.Redis.from_url(self._url, socket_timeout=t,
                                                    socket_connect_timeout=t)
        return self._client

    def _beat(self) -> Beat:
        r = self._redis()
        lease = self.keys.node_lease(self.number)
        script, call = self._renew, (1, lease, self.token, self.lease_ttl_s)
        try:
            state = int(r.evalsha(script.sha, *call))  # type: ignore[arg-type]
        except NoScriptError:
            state = int(r.eval(script.text, *call))  # type: ignore[arg-type]
        retaken = state == 0 and bool(r.set(lease, self.token, nx=True, ex=self.lease_ttl_s))
        now = time.time()
        pipe = r.pipeline(transaction=False)
        pipe.zadd(self.keys.nodes(), {self.name: now + self.heartbeat_ttl_s})
        pipe.zremrangebyscore(self.keys.nodes(), "-inf", now - 3600)  # forget the long dead
        pipe.zrange(self.keys.nodes(), 0, -1, withscores=True)
        *_, live = pipe.execute()
        lost = self._check_canaries(r) if isinstance(r, RedisCluster) else False
        return Beat(held=state == 1 or retaken, retaken=retaken,
                    live={n.decode(): float(expiry) for n, expiry in live}, lost=lost,
                    read_at=now)

    def _check_canaries(self, r: RedisCluster) -> bool:
        """Set this node's canary on every master; True if one that was set
        before had vanished (that master restarted empty, or was replaced)."""
        primaries = r.get_primaries()  # type: ignore[no-untyped-call]
        masters = {f"{n.host}:{n.port}" for n in primaries}
        # The masters changed (one failed and left the client's view, or came
        # back): whatever it held may be gone, so that counts as a loss too.
        changed = masters != set(self._canaries)
        if changed:
            self._canaries = self._pick_canaries(r, masters)
        gone = False
        for key in self._canaries.values():
            old = r.set(key, "1", ex=self.lease_ttl_s, get=True)
            gone = gone or old is None
        lost = (gone or changed) and self._canaries_set
        self._canaries_set = True
        return lost

    def _pick_canaries(self, r: RedisCluster, masters: set[str]) -> dict[str, str]:
        out: dict[str, str] = {}
        for i in range(10_000):
            if len(out) == len(masters):
                break
            key = self.keys.canary(f"c{i}", self.name)
            node = r.get_node_from_key(key)  # type: ignore[no-untyped-call]
            where = f"{node.host}:{node.port}"
            if where in masters and where not in out:
                out[where] = key
        return out

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.period_s + 5)
        if self._client is not None:
            self._client.close()
