"""The faults a nemesis run applies, and when: ``Fault``, the CI schedule (every
kind once) and the long schedule (every kind again and again, seeded)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CLUSTER_KINDS", "KINDS", "NODE_KINDS", "Fault", "ci_schedule", "long_schedule"]

KINDS = ("kill9", "drain", "redis", "store_pause", "broker_cut")
CLUSTER_KINDS = ("kill9", "drain", "redis_master", "store_pause", "broker_cut")
NODE_KINDS = ("kill9", "drain", "broker_cut")  # the kinds aimed at one node
# redis_master: ``node`` is the Redis Cluster master (1..3) killed and started again


@dataclass
class Fault:
    """One fault of the schedule: what, when, for how long, on which node; and,
    once applied, when it started and healed and the evidence it took effect."""

    kind: str
    at: float  # seconds after the traffic started
    duration: float  # seconds between the fault and its heal (drain: at least)
    node: int = -1  # for kill9, drain, broker_cut
    # filled in when applied
    t_start: float | None = None
    t_heal: float | None = None
    evidence: dict[str, Any] = field(default_factory=dict)
    skipped: str | None = None


def ci_schedule(nodes: int = 3, redis_cluster: bool = False) -> list[Fault]:
    """Every kind once, over about 70 s (the pytest test); on a Redis Cluster
    one master is killed instead of the whole Redis."""
    redis = Fault("redis_master", 31, 4, 2) if redis_cluster else Fault("redis", 31, 4)
    return [Fault("kill9", 6, 4, 0), Fault("drain", 18, 3, 1 % nodes), redis,
            Fault("store_pause", 44, 4), Fault("broker_cut", 56, 6, 2 % nodes)]


def _durations(rng: random.Random) -> dict[str, float]:
    """A duration for each kind: all five drawn, in this order, whichever is used
    (so a seed gives the same schedule as ever)."""
    return {"kill9": rng.uniform(2, 6), "drain": rng.uniform(1, 4),
            "redis": rng.uniform(2, 6), "store_pause": rng.uniform(2, 6),
            "broker_cut": rng.uniform(3, 8)}


def long_schedule(seconds: float, seed: int, nodes: int = 3,
                  redis_cluster: bool = False) -> list[Fault]:
    """Every kind in a shuffled order, again and again, one fault every ~14 s,
    the last one healed at least 10 s before the end (on a Redis Cluster a
    master, drawn at random, instead of the whole Redis)."""
    rng = random.Random(seed)
    out: list[Fault] = []
    t = 6.0
    while True:
        for kind in rng.sample(KINDS, len(KINDS)):
            dur = _durations(rng)[kind]
            if t + dur + 20 > seconds:
                return out
            node = rng.randrange(nodes) if kind in NODE_KINDS else -1
            if kind == "redis" and redis_cluster:
                kind, node = "redis_master", 1 + int(t * 1000) % 3
            out.append(Fault(kind, round(t, 1), round(dur, 1), node))
            t += dur + rng.uniform(8, 12)
