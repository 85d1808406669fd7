"""The settings of a nemesis run (``NemesisConfig``) and the constants its parts
share: the nodes' token secret and the SDK's sync page size."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from testkit.nemesis.schedule import Fault, ci_schedule

__all__ = ["SECRET", "SYNC_LIMIT", "NemesisConfig"]

SECRET = "nemesis-secret-0123456789-abcdefghij"
SYNC_LIMIT = 200


def _default_amqp_url() -> str:
    return os.environ.get("IM_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/").split(",")[0].strip()


def _default_mongo_url() -> str:
    return os.environ.get("IM_MONGO_URL", "mongodb://127.0.0.1:27017")


@dataclass
class NemesisConfig:
    """What one run does: how long, which faults, how big a cluster, how much traffic."""

    seconds: float = 75.0  # traffic time; the schedule's faults fall inside it
    schedule: list[Fault] = field(default_factory=ci_schedule)
    nodes: int = 3
    users: int = 12
    groups: int = 2
    dm_interval: float = 0.25
    group_interval: float = 0.5
    room_interval: float = 1.0
    churn_interval: float = 1.5  # a random user's socket dropped this often (0: never)
    private_mongo: bool = True  # False: the shared server (no store pause)
    redis_cluster: bool = False  # a private 3-master Redis Cluster instead of one Redis
    tree: Path | None = None  # the checkout the nodes run (default: this one)
    seed: int = 1
    settle_s: float = 25.0  # the most the checker waits for the cluster to settle
    send_timeout: float = 60.0
    log_dir: Path | None = None
    amqp_url: str = field(default_factory=_default_amqp_url)
    shared_mongo_url: str = field(default_factory=_default_mongo_url)
