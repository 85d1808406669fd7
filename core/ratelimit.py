"""Token buckets: pure, clock passed in. ``TokenBucket`` is one; ``KeyedBuckets``
one per key (user), bounded, with rate 0 meaning no limit."""

from __future__ import annotations

import collections
import math

__all__ = ["MAX_KEYS", "KeyedBuckets", "TokenBucket"]

MAX_KEYS = 100_000  # keys with a live bucket (oldest dropped past it)


class TokenBucket:
    """``rate`` tokens per second, at most ``burst`` saved up."""

    __slots__ = ("rate", "burst", "tokens", "stamp")

    def __init__(self, rate: float, burst: int, now: float) -> None:
        self.rate = rate
        self.burst = float(burst)
        self.tokens = float(burst)
        self.stamp = now

    def take(self, now: float, n: float = 1.0) -> bool:
        elapsed = now - self.stamp
        if elapsed > 0:
            self.tokens = min(self.burst, self.tokens + elapsed * self.rate)
            self.stamp = now
        if self.tokens >= n:
            self.tokens -= n
            return True
        return False

    def debit(self, now: float, n: float) -> None:
        """Spend ``n`` more for work already done (the bucket may go below zero,
        at most a burst: the next calls wait until it refills)."""
        self.take(now, 0.0)  # refill to now
        self.tokens = max(-self.burst, self.tokens - n)


class KeyedBuckets:
    """A token bucket per key (a user), pure (the clock is passed in). Buckets are kept
    in least-recently-used order; one idle long enough to be full again is the
    same as a new one and is dropped, and past ``max_users`` the oldest goes,
    so the map stays bounded whatever the number of callers."""

    def __init__(self, rate: float, burst: int, max_users: int = MAX_KEYS) -> None:
        self.rate, self.burst, self.max_users = rate, burst, max_users
        self.refill_s = burst / rate if rate > 0 else 0.0
        self._buckets: collections.OrderedDict[str, TokenBucket] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._buckets)

    def take(self, user: str, now: float, n: float = 1.0) -> bool:
        """A call by ``user`` at ``now`` costing ``n`` tokens: False if over the rate."""
        if self.rate <= 0:
            return True
        bucket = self._buckets.get(user)
        if bucket is None:
            bucket = self._buckets[user] = TokenBucket(self.rate, self.burst, now)
        else:
            self._buckets.move_to_end(user)
        allowed = bucket.take(now, n)
        self._drop_idle(now)
        return allowed

    def debit(self, user: str, now: float, n: float) -> None:
        """``user`` spends ``n`` more for a call that turned out to cost more."""
        if self.rate <= 0 or n <= 0:
            return
        bucket = self._buckets.get(user)
        if bucket is None:
            bucket = self._buckets[user] = TokenBucket(self.rate, self.burst, now)
        bucket.debit(now, n)

    def retry_after(self, user: str) -> int:
        """Whole seconds until ``user`` has a token again (at least 1)."""
        bucket = self._buckets.get(user)
        missing = 1.0 - (bucket.tokens if bucket is not None else 1.0)
        return max(1, math.ceil(missing / self.rate)) if self.rate > 0 else 1

    def _drop_idle(self, now: float) -> None:
        while self._buckets:
            user, oldest = next(iter(self._buckets.items()))
            full_in = (oldest.burst - oldest.tokens) / self.rate  # a debited one: longer
            if len(self._buckets) <= self.max_users and now - oldest.stamp < full_in:
                return
            del self._buckets[user]
