"""``IM_REDIS_URL`` for a Redis Cluster: comma-separated seeds (pure, no I/O)."""

from __future__ import annotations

from urllib.parse import urlsplit

__all__ = ["cluster_seeds"]


def cluster_seeds(url: str) -> list[tuple[str, int]]:
    """(host, port) of each comma-separated ``redis://`` seed; ValueError names a bad one."""
    seeds = []
    for item in url.split(","):
        part = urlsplit(item.strip())
        try:
            port = part.port or 6379
        except ValueError:
            raise ValueError(f"not a redis://host:port seed: {item.strip()!r}") from None
        if part.scheme not in ("redis", "rediss") or not part.hostname:
            raise ValueError(f"not a redis://host:port seed: {item.strip()!r}")
        if part.path not in ("", "/", "/0"):
            raise ValueError(f"a Redis Cluster has only database 0: {item.strip()!r}")
        seeds.append((part.hostname, port))
    return seeds
