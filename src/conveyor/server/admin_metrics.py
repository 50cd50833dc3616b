"""Prometheus metrics at ``/metrics``, through ``prometheus-client``.

A custom collector reads the same frozen statistics records as the JSON tree when it
is scraped, so the publish and delivery paths keep nothing extra for it (the engine's
cumulative counters are already there). Names follow Prometheus conventions: the
``conveyor_`` prefix, base units in the name (``_seconds``, ``_bytes``), ``_total`` for
counters (the client library adds it), one label per dimension (``queue``,
``destination``, ``source``). Clients are summed, not labelled: 10,000 clients would
be 10,000 series per metric.

Cost: one ``Queue.statistics`` per queue and scrape, and the per-queue families are
rendered by :func:`render_queues` (why: its docstring); bench/bench_admin.py measures a
scrape with 1,000 queues (docs/benchmarks.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from prometheus_client.core import CollectorRegistry, CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from conveyor.engine import poison
from conveyor.engine.core import VERSION
from conveyor.server.commit import COMMIT_SECONDS_BUCKETS

if TYPE_CHECKING:
    from conveyor.server.server import Server

__all__ = ["CONTENT_TYPE_LATEST", "ServerCollector", "render"]

# (QueueStats field, metric name, help, kind): kind "gauge" or "counter".
_QUEUE_METRICS = (
    ("queue_depth", "conveyor_queue_depth", "Unacknowledged active messages: available + leased (+ owned by another instance, replicated queues)", "gauge"),
    ("available", "conveyor_queue_available_messages", "Messages ready for delivery", "gauge"),
    ("backlog", "conveyor_queue_leased_messages", "Leased messages awaiting an acknowledgement", "gauge"),
    ("awaiting_ack", "conveyor_queue_awaiting_ack_messages",
     "At-most-once deliveries whose acknowledgement has not arrived", "gauge"),
    ("consumers", "conveyor_queue_consumers", "Subscribers taking deliveries", "gauge"),
    ("inactive_message_count", "conveyor_queue_inactive_messages", "Messages beyond TargetQueueDepth", "gauge"),
    ("deferred_ack_count", "conveyor_queue_deferred_acks", "Acknowledgements held for inactive messages", "gauge"),
    ("barriers_pending", "conveyor_queue_barriers_pending", "Barrier messages still in the queue", "gauge"),
    ("enqueued", "conveyor_queue_enqueued", "Messages that entered the queue", "counter"),
    ("delivered", "conveyor_queue_delivered", "Deliveries (redeliveries included)", "counter"),
    ("acknowledged", "conveyor_queue_acknowledged", "Messages acknowledged", "counter"),
    ("expired", "conveyor_queue_expired", "Messages expired", "counter"),
    ("expired_leases", "conveyor_queue_expired_leases", "Leases that expired", "counter"),
    ("returned", "conveyor_queue_returned", "Leases broken by unsubscribe, disconnect or restart", "counter"),
    ("cancelled", "conveyor_queue_cancelled", "Leases cancelled by subscribers", "counter"),
    ("filter_errors", "conveyor_queue_filter_errors", "Filter evaluations that raised", "counter"),
    ("barriers_delivered", "conveyor_queue_barriers_delivered", "Barrier messages delivered", "counter"),
)


class ServerCollector:
    """Yields every metric family from the server's statistics at scrape time."""

    def __init__(self, server: Server) -> None:
        self._server = server

    def describe(self) -> list:
        return []  # collected lazily: no describe-time scrape at registration

    def collect(self) -> Iterator:
        server = self._server
        now = server.clock()
        engine = server.engine
        s = server.statistics()
        cfg = server.config

        info = GaugeMetricFamily("conveyor_info", "The instance (value 1)", labels=["instance", "version"])
        info.add_metric([cfg.name, VERSION], 1)
        yield info
        yield _gauge("conveyor_start_time_seconds", "When the server started (epoch seconds)", server.started_at)
        yield _gauge("conveyor_up_ready", "1 when recovered and serving, 0 otherwise", 1 if server.ready else 0)
        yield _gauge("conveyor_failed", "1 when the server stopped itself after a failure", 1 if s.failed else 0)
        yield _gauge("conveyor_connections", "Open connections (clients and replication)", s.connections)
        yield _gauge("conveyor_clients", "Client sessions", len(engine.sessions))
        yield _counter("conveyor_frames_received", "Frames received from clients", s.frames_in)
        unsent = 0
        for conn in server.connections.values():
            if conn.transport is not None and not conn.closed:
                unsent += conn.transport.get_write_buffer_size()
        yield _gauge("conveyor_clients_unsent_bytes", "Output written and not yet sent, all connections", unsent)

        # journal
        j = server.journal
        first = j.first_position if cfg.transaction_log is not None else 0
        yield _gauge("conveyor_journal_end_bytes", "Journal end position (bytes)", j.end)
        yield _gauge("conveyor_journal_durable_end_bytes", "Journal position durable on disk (bytes)", j.durable_end)
        yield _gauge("conveyor_journal_size_bytes", "Journal bytes kept (durable end - first position)",
                     j.durable_end - first)
        yield _gauge("conveyor_journal_unwritten_bytes", "Appended, not yet durable", j.end - j.durable_end)
        if cfg.transaction_log is not None:
            yield _gauge("conveyor_journal_segments", "Journal segment files", j.statistics().segments)
        c = server.commit_stats

        cumulative, buckets = 0, []
        for bound, n in zip(COMMIT_SECONDS_BUCKETS, c.buckets):
            cumulative += n
            buckets.append(("+Inf" if bound == float("inf") else repr(bound), cumulative))
        h = HistogramMetricFamily("conveyor_journal_commit_seconds", "Group commit: write + fsync time",
                                  buckets=buckets, sum_value=c.seconds_sum)
        yield h
        yield _counter("conveyor_journal_commit_bytes", "Bytes written by group commits", c.bytes_sum)
        yield _counter("conveyor_journal_commit_records", "Records written by group commits", c.records_sum)

        # engine
        yield _gauge("conveyor_publishers", "Publishers known to duplicate detection", engine.publishes.publishers)
        yield _gauge("conveyor_pending_publishes", "Publishes appended, not yet durable", len(engine.publishes.pending))
        yield _counter("conveyor_cache_misses", "Message cache misses (journal reads)", engine.cache.misses)
        yield _counter("conveyor_publishes_unrouted",
                       "Publishes to a topic not recorded and with no subscriber: they reached no one",
                       engine.publishes_unrouted)
        yield _skipped()
        topic_subs, replays = engine.topics.statistics()
        yield _gauge("conveyor_topic_subscriptions", "Pub/sub and replay subscriptions", topic_subs)
        yield _gauge("conveyor_replays", "Bookmark replays still reading the journal", replays)

        # replication
        outgoing, incoming = engine.replication.statistics(now)
        up = GaugeMetricFamily("conveyor_replication_link_up", "1 when the link to a destination is streaming",
                               labels=["destination"])
        lag_b = GaugeMetricFamily("conveyor_replication_behind_bytes", "Journal bytes the destination lacks",
                                  labels=["destination"])
        lag_s = GaugeMetricFamily("conveyor_replication_behind_seconds",
                                  "Age of the oldest record the destination lacks", labels=["destination"])
        sent = CounterMetricFamily("conveyor_replication_records_sent", "Records sent to a destination",
                                   labels=["destination"])
        for link in outgoing:
            up.add_metric([link.destination], 1 if link.state == "streaming" else 0)
            lag_b.add_metric([link.destination], link.bytes_behind)
            lag_s.add_metric([link.destination], link.seconds_behind or 0.0)
            sent.add_metric([link.destination], link.records_sent)
        received = CounterMetricFamily("conveyor_replication_records_received", "Records received from a source",
                                       labels=["source"])
        for link in incoming:
            received.add_metric([link.source], link.records_received)
        yield from (up, lag_b, lag_s, sent, received)


_QUEUE_EXTRA = (
    ("conveyor_queue_oldest_lease_age_seconds", "Seconds since the oldest current lease began", "gauge"),
    ("conveyor_queue_seconds_behind", "Age of the oldest unacknowledged message", "gauge"),
    ("conveyor_queue_max_backlog", "The configured MaxBacklog", "gauge"),
    ("conveyor_queue_target_depth", "The configured TargetQueueDepth", "gauge"),
)


def render_queues(server: Server) -> bytes:
    """The per-queue families (``queue`` label), in the text exposition format.

    Written here rather than through metric-family objects: these are most of a
    scrape (21 samples per queue), and the library's generic renderer escapes every
    label and formats every value through general code, which costs about a second per
    scrape with 1,000 queues on a small machine (docs/benchmarks.md). Here each
    queue's label is escaped once per scrape and integers are printed as integers. The
    output is the same format (tests/integration/test_admin.py parses it with the
    library's parser)."""
    now = server.clock()
    stats = [(_label(name), queue.statistics(now)) for name, queue in server.engine.queues.items()]
    out: list[str] = []
    for field, name, help_text, kind in _QUEUE_METRICS:
        sample = f"{name}_total" if kind == "counter" else name
        out.append(f"# HELP {sample} {help_text}\n# TYPE {sample} {kind}\n")
        out.extend(f"{sample}{label} {getattr(st, field)}\n" for label, st in stats)
    extra = (
        [(label, st.age_of_oldest_lease or 0.0) for label, st in stats],
        [(label, st.seconds_behind or 0.0) for label, st in stats],
        [(label, st.max_backlog) for label, st in stats if st.max_backlog is not None],
        [(label, st.target_queue_depth) for label, st in stats if st.target_queue_depth is not None],
    )
    for (name, help_text, kind), values in zip(_QUEUE_EXTRA, extra):
        out.append(f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n")
        out.extend(f"{name}{label} {value!r}\n" for label, value in values)
    return "".join(out).encode()


def _label(queue: str) -> str:
    escaped = queue.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    return f'{{queue="{escaped}"}}'


def _gauge(name: str, help_text: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, help_text, value=value)


def _skipped() -> CounterMetricFamily:
    family = CounterMetricFamily("conveyor_messages_skipped", "Messages skipped for one consumer at one stage "
                                 "of delivery: parse, filter, projection, join, delta, encode (engine/poison.py)",
                                 labels=["stage"])
    for stage, n in sorted(poison.SKIPPED.items()):
        family.add_metric([stage], n)
    return family


def _counter(name: str, help_text: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, help_text, value=value)


def registry(server: Server) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(ServerCollector(server))
    return reg


def render(server: Server, reg: CollectorRegistry) -> bytes:
    """The text exposition format of every family: the instance's through the library,
    the queues' by :func:`render_queues`."""
    return generate_latest(reg) + render_queues(server)
