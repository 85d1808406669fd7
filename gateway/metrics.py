"""Prometheus metrics of one node (a registry per node, so tests can run many)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from router import BrokerStatus

__all__ = ["NodeMetrics"]


class NodeMetrics:
    """Every counter the node exposes on ``/metrics``."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        # The process (process_cpu_seconds_total, process_resident_memory_bytes,
        # process_open_fds, process_max_fds, ...; Linux /proc), Python's GC and
        # python_info: the default registry has them, a registry of our own not.
        ProcessCollector(registry=r)
        GCCollector(registry=r)
        PlatformCollector(registry=r)
        self.connections = Gauge("im_connections", "Open WebSocket connections", registry=r)
        self.frames_in = Counter("im_frames_in_total", "Client frames received", ["op"],
                                 registry=r)
        self.errors = Counter("im_errors_total", "Error replies sent", ["code"], registry=r)
        self.limit_refusals = Counter("im_limit_refusals_total", "Calls or users refused by a "
                                      "per-user cap or quota, by its setting", ["limit"],
                                      registry=r)
        self.events = Counter("im_events_total", "Events out by type and outcome "
                              "(published, retried, dropped)", ["type", "outcome"], registry=r)
        self.sanctions_unchecked = Counter(
            "im_sanctions_unchecked_total",
            "Handshakes and HTTP calls admitted without a ban/revocation check (Redis down)",
            registry=r)
        self.controls = Counter("im_controls_applied_total", "Membership, relation and "
                                "session controls applied on this node, by kind", ["kind"],
                                registry=r)
        self.sends = Counter("im_sends_total", "1:1 sends by outcome", ["outcome"], registry=r)
        self.unfinished_sends = Counter(
            "im_unfinished_sends_total", "Sends that failed after their message may have "
            "been stored, finished by the node itself: finished (found, delivered), "
            "not_stored, dropped (over the bound)", ["outcome"], registry=r)
        self.send_latency = Histogram(
            "im_send_ack_seconds", "Send received to ack written",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
            registry=r,
        )
        self.pushes = Counter("im_pushes_total", "Frames written to sockets by pushes",
                              registry=r)
        self.push_skipped = Counter(
            "im_push_skipped_total", "Pushes skipped: socket write buffer over bound",
            registry=r,
        )
        self.batch_size = Histogram(
            "im_store_batch_size", "Messages per store batch", ["stage"],
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512), registry=r,
        )
        stage_buckets = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
        self.stage_wait = Histogram(
            "im_store_stage_wait_seconds", "Time the oldest item of a batch queued before "
            "its flush began", ["stage"], buckets=stage_buckets, registry=r)
        self.stage_flush = Histogram(
            "im_store_stage_flush_seconds", "Time one batch flush took", ["stage"],
            buckets=stage_buckets, registry=r)
        self.store_commands = Histogram(
            "im_store_command_seconds", "Time one MongoDB command took, by command, "
            "collection, query shape (the fields a read filters and sorts on) and outcome",
            ["command", "collection", "shape", "outcome"], buckets=stage_buckets, registry=r)
        self.sync_reads = Histogram(
            "im_sync_cursor_age_seconds", "How far back a sync's cursor (since) is, by where "
            "its 1:1 page was read: redis (the offline store vouched for the range) or mongo "
            "(the boxes: after a Redis loss, or a cursor older than the offline store)",
            ["source"], buckets=(1, 5, 15, 60, 300, 1800, 3600, 86_400, 604_800), registry=r)
        self.hook_calls = Counter(
            "im_hook_calls_total", "Hook calls (IM_HOOK_URL) by hook and outcome: allow, "
            "rewrite, reject, timeout, error", ["hook", "outcome"], registry=r)
        self.hook_seconds = Histogram(
            "im_hook_seconds", "Time a hook call took, a place among IM_HOOK_MAX_INFLIGHT "
            "included", ["hook"], buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                           0.5, 1, 2.5), registry=r)
        self.group_sync_pages = Counter(
            "im_group_sync_pages_total", "Groups a sync read read-diffused messages of, by "
            "where: redis (the frames a group keeps of its newest messages) or mongo (a "
            "message too old, too big, or a group whose kept frames are gone)",
            ["source"], registry=r)
        self.offline_fills = Counter(
            "im_offline_fills_total", "Syncs that read MongoDB and put what they read into "
            "the offline store (filled), or could not (refused: a hole below its floor, a "
            "recall or deletion meanwhile, or Redis failed)", ["outcome"], registry=r)
        self.loop_lag = Histogram(
            "im_loop_lag_seconds", "How late a 100 ms timer on the event loop fires: the "
            "loop's longest turns (a big write, a GC pause, a blocking call)",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1), registry=r)
        self.closed = Counter("im_closed_total", "Connections closed by the node",
                              ["reason"], registry=r)
        self.beats = Counter("im_heartbeats_total", "Lease renewals and heartbeats by "
                             "result (held, lost, unavailable)", ["result"], registry=r)
        self.replays = Counter("im_broker_replays_total",
                               "Replays of offline entries after a broker outage", registry=r)
        self._rooms(r)
        self.http_requests = Counter("im_http_requests_total", "HTTP API calls",
                                     ["route", "status"], registry=r)

    def _rooms(self, r: CollectorRegistry) -> None:
        self.rooms = Gauge("im_rooms", "Rooms with local members", registry=r)
        self.room_members = Gauge("im_room_members", "Local room memberships", registry=r)
        self.room_sends = Counter("im_room_sends_total", "room_send frames by outcome",
                                  ["outcome"], registry=r)
        self.room_msgs_in = Counter("im_room_msgs_in_total",
                                    "Room messages queued for local members", registry=r)
        self.room_dropped = Counter(
            "im_room_msgs_dropped_total", "Room messages not delivered to this node's members: "
            "cap (sampled out by the per-room delivery cap), overflow (queue bound), no_members",
            ["reason"], registry=r)
        self.room_frames = Counter("im_room_frames_total", "room_msgs frames built", registry=r)
        self.room_writes = Counter("im_room_writes_total", "room_msgs frames written to sockets",
                                   registry=r)
        self.room_delivered = Counter("im_room_deliveries_total",
                                      "Room messages written to sockets (message x member)",
                                      registry=r)
        self.room_skipped = Counter(
            "im_room_writes_skipped_total",
            "room_msgs writes skipped: the member's socket write buffer is over its bound",
            registry=r)
        self.room_flush_seconds = Histogram(
            "im_room_flush_seconds", "CPU time of one room flush (cap, encode, write to all)",
            buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1),
            registry=r)
        self.room_stage = Histogram(
            "im_room_stage_seconds", "Stages of a room message on a node: position (the "
            "oldest of a room's batch queued to its position taken), window (the oldest of "
            "a room's window queued to the flush), write (flush to the last member written)",
            ["stage"], buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15,
                                0.2, 0.3, 0.5, 1), registry=r)
        self.room_held = Counter(
            "im_room_held_total", "Room flushes that held messages back for a missing "
            "position (another node's message still crossing the broker)", registry=r)
        self.room_recoveries = Counter(
            "im_room_recoveries_total", "Rooms this node may have missed messages of (a gap "
            "past the reorder wait, or a broker outage), by outcome: recovered (from the "
            "history, late but in order), gap (no longer kept: members told room_gap), "
            "failed (history unreadable: room_gap), timeout (no answer in time: room_gap)",
            ["outcome"], registry=r)
        self.room_positions = Counter(
            "im_room_position_calls_total", "Redis calls positioning and keeping room "
            "messages, by outcome (ok, unavailable); one per room per window", ["outcome"],
            registry=r)
        self.room_bind_ops = Counter("im_room_bind_ops_total",
                                     "Bindings (rooms, groups, presence) made and removed on the "
                                     "broker, by op: bind, unbind, repair (a key in use found "
                                     "unbound after a broker reconnect: a bug)", ["op"],
                                     registry=r)
        self.room_bind_ops_minute = Gauge(
            "im_room_bind_ops_last_minute", "Room binds plus unbinds in the last 60 seconds",
            registry=r)

    def watch_broker(self, status: Callable[[], BrokerStatus]) -> None:
        """Report the broker link, read from ``status`` at each scrape (once per node)."""
        self.registry.register(_BrokerCollector(status))

    def observe_store_command(self, command: str, collection: str, shape: str,
                              seconds: float, ok: bool) -> None:
        self.store_commands.labels(command, collection, shape,
                                   "ok" if ok else "failed").observe(seconds)

    def stage_observer(self, stage: str) -> Callable[[int, float, float], None]:
        """A ``Batcher`` observer feeding this stage's histograms."""
        size = self.batch_size.labels(stage)
        wait = self.stage_wait.labels(stage)
        flush = self.stage_flush.labels(stage)

        def observe(n: int, waited: float, took: float) -> None:
            size.observe(n)
            wait.observe(waited)
            flush.observe(took)

        return observe

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _BrokerCollector:
    """The broker link's state, read from the router when scraped."""

    def __init__(self, status: Callable[[], BrokerStatus]) -> None:
        self.status = status

    def describe(self) -> list[Metric]:  # the names, for the registry's clash check
        return self._families(BrokerStatus(connected=False, node_index=-1, reconnects=0,
                                           failovers=0))

    def collect(self) -> list[Metric]:
        return self._families(self.status())

    @staticmethod
    def _families(s: BrokerStatus) -> list[Metric]:
        return [
            GaugeMetricFamily("im_broker_connected",
                              "1 while the node is connected to the broker, else 0",
                              value=int(s.connected)),
            GaugeMetricFamily("im_broker_node_index",
                              "Entry of IM_AMQP_URL the node is connected to (0: the first); "
                              "-1 while disconnected", value=s.node_index),
            CounterMetricFamily("im_broker_reconnects",
                                "Broker connections restored after a loss", value=s.reconnects),
            CounterMetricFamily("im_broker_failovers",
                                "Broker connections restored on another IM_AMQP_URL entry "
                                "than the one lost", value=s.failovers),
        ]
