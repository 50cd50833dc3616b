"""The statistics tree of the admin interface, as plain JSON-ready values.

Built on demand from the frozen statistics records (``Engine.statistics``,
``Queue.statistics``, ``Queue.details``, ``Replication.statistics``,
``Journal.statistics``) and the server's connections; nothing here is kept between
requests, and nothing here runs on the publish or delivery paths. Rules:

1. The tree follows the reference's admin paths (``/amps/instance/...``): ``instance``
   at the root with ``queues``, ``clients``, ``subscriptions``, ``journal`` and
   ``replication`` under it. Metric names are the reference's where it has one
   (``queue_depth``, ``backlog``, ``inactive_message_count``, ``deferred_ack_count``,
   ``age_of_oldest_lease``, ``seconds_behind``, ``expired_leases``...), conveyor's
   own otherwise. Durations are seconds, sizes bytes, times epoch seconds.
2. Only the subtree asked for is built: one queue's statistics cost one queue, not
   every queue (1,000 queues and 10,000 clients are the sizes measured in bench/).
3. Per-queue replicated-queue metrics (``owned``, ``elsewhere``, ``transferred_in``,
   ``transferred_out``, ``proxied_transfer``) are the queue's own statistics; a
   replicated queue adds its transfer figures (requests, grants, claims, conflicts) from
   the engine's ownership part (:func:`replicated_queue_metrics`).
4. Each queue's ``settings`` are its effective configuration, read from the
   ``QueueConfig`` the engine runs with (defaults included: nothing here knows a
   default), under the configuration's element names (:func:`queue_settings`).
   Durations are seconds; ``null`` is the setting's "none": no limit, no expiry, an
   endless lease, no expression (an infinite duration is ``null`` too, as JSON has no
   infinity).
"""

from __future__ import annotations

import math
import os
import platform
from typing import TYPE_CHECKING, Any

import msgspec

from conveyor.protocol.bookmarks import format_bookmark
from conveyor.engine import poison
from conveyor.engine.core import VERSION
from conveyor.engine.explain import consumer_label
from conveyor.engine.filters import compile_filter
from conveyor.engine.sessions import SubKind

if TYPE_CHECKING:
    from conveyor.config.model import QueueConfig
    from conveyor.server.server import Server

#: Messages listed by a queue's ``details`` unless the request asks for another limit.
DETAILS_MESSAGES_DEFAULT = 500
DETAILS_MESSAGES_MAX = 100_000


def plain(value: Any) -> Any:
    """Frozen records (dataclasses, msgspec structs) as JSON-ready values."""
    return msgspec.to_builtins(value, str_keys=True)


# --- instance ----------------------------------------------------------------------------------


def instance(server: Server, now: float) -> dict:
    """The instance without its big children (queues, clients, subscriptions)."""
    engine = server.engine
    s = server.statistics()
    return {
        "name": server.config.name,
        "group": server.config.group or server.config.name,
        "version": VERSION,
        "pid": os.getpid(),
        "hostname": platform.node(),
        "started_at": server.started_at,
        "uptime": max(0.0, now - server.started_at),
        "ready": server.ready,
        "failed": s.failed,
        "failure": str(server.failure) if server.failure is not None else None,
        "connections": s.connections,
        "client_count": sum(1 for c in server.connections if c in engine.sessions),
        "frames_in": s.frames_in,
        "queue_count": len(engine.queues),
        "config_source": server.config.source,
    }


def journal(server: Server) -> dict:
    """The transaction log: where, how big, how far durable, how fast commits are."""
    j = server.journal
    c = server.commit_stats
    tlog = server.config.transaction_log
    out: dict[str, Any] = {
        "directory": str(tlog.journal_directory.resolve()) if tlog is not None else None,
        "in_memory": tlog is None,
        "first_position": j.first_position if tlog is not None else 0,
        "end": j.end,
        "durable_end": j.durable_end,
        "unwritten_bytes": j.end - j.durable_end,
        "bytes": j.durable_end - (j.first_position if tlog is not None else 0),
        "commits": c.count,
        "commit_seconds_last": c.last_seconds,
        "commit_seconds_mean": c.seconds_sum / c.count if c.count else None,
        "commit_seconds_max": c.seconds_max,
        "commit_bytes_mean": c.bytes_sum / c.count if c.count else None,
        "commit_bytes_max": c.bytes_max,
        "commit_records_mean": c.records_sum / c.count if c.count else None,
        "commit_records_max": c.records_max,
    }
    if tlog is not None:
        st = j.statistics()
        out.update(segments=st.segments, records_written=st.records_written, bytes_written=st.bytes_written,
                   fsyncs=st.fsyncs, segment_bytes=tlog.segment_bytes)
    return out


def engine_summary(server: Server, now: float) -> dict:
    """The engine's own counters (no per-queue statistics)."""
    e = server.engine
    topic_subs, replays = e.topics.statistics()
    return {
        "publishers": e.publishes.publishers,
        "pending_publishes": len(e.publishes.pending),
        "held_sends": e.outbox.held,
        "cache_misses": e.cache.misses,
        "publishes_unrouted": e.publishes_unrouted,  # not recorded, no subscriber: reached no one
        "messages_skipped": dict(poison.SKIPPED),  # per stage, for one consumer each (engine/poison.py)
        "topic_subscriptions": topic_subs,
        "replays": replays,
        "queue_consumers": e.delivery.consumers(),
        "named_consumers": plain(e.named.statistics()),
        "staging": plain(e.transactions.staging.statistics()),
        "queue_metadata": queue_metadata(server),
    }


def queue_metadata(server: Server) -> dict | None:
    """The FileBackedMetadata budget (engine/queue/budget.py): resident bytes of every
    paged queue's state against ``Limits/QueueMetadataMemory``, and the chunks paged in
    and out since the start. None without a transaction log (nothing is paged)."""
    pages = getattr(server, "pages", None)
    if pages is None:
        return None
    b = pages.budget
    return {"budget_bytes": b.limit, "resident_bytes": b.resident, "resident_chunks": len(b),
            "page_ins": b.page_ins, "page_outs": b.page_outs}


# --- queues --------------------------------------------------------------------------------------


def replicated_queue_metrics(server: Server, name: str) -> dict:
    """Rule 3: what a replicated queue adds (empty for any other queue)."""
    own = server.engine.replicated_queues.by_queue.get(name)
    if own is None:
        return {}
    stats = own.statistics()
    return {"proxied_transfer": stats.proxied_transfer, "transfer_requests_sent": stats.requests_sent,
            "transfer_grants": stats.grants, "proxied_claims": stats.proxied_claims,
            "ownership_conflicts": stats.conflicts, "transfer_wait": stats.typical_ack_s}


def _seconds(value: float | None) -> float | None:
    """A duration setting: None (and an infinite one, which JSON cannot hold) is null."""
    return None if value is None or math.isinf(value) else value


def queue_settings(cfg: QueueConfig) -> dict:
    """Rule 4: the queue's effective settings, keyed by their configuration elements."""
    return {
        "Semantics": cfg.semantics.value,
        "FairnessModel": cfg.fairness.value,
        "Leasing": cfg.leasing.value,
        "LeasePeriod": _seconds(cfg.lease_period_s),  # null: a lease never ends on its own
        "Expiration": _seconds(cfg.expiration_s),  # null: messages never expire
        "MaxBacklog": cfg.max_backlog,  # null: no limit
        "MaxPerSubscriptionBacklog": cfg.max_per_subscription_backlog,  # null: the subscription's own
        "MaxCancels": cfg.max_cancels,  # null: no maximum
        "MaxDeliveries": cfg.max_deliveries,  # null: no maximum
        "TargetQueueDepth": cfg.target_queue_depth,  # null: every message is active
        "Priority": cfg.priority,
        "BarrierExpression": cfg.barrier_expression,
        "Filter": cfg.filter,
        "UnderlyingTopic": cfg.underlying,
        "DefaultPublishTarget": cfg.default_publish_target,  # null: none (a regex UnderlyingTopic)
        "RecoveryPoint": cfg.recovery_point,  # null: epoch, the whole log
        "DeferredAckExpiration": _seconds(cfg.deferred_ack_expiration_s),
        "FileBackedMetadata": cfg.file_backed_metadata,
        "RetryBackoff": list(cfg.retry_backoff_s) or None,  # null: a cancelled message returns at once
        "OrderingKey": cfg.ordering_key,  # null: no per-key ordering
        "MaxInFlightPerKey": cfg.max_in_flight_per_key if cfg.ordering_key else None,
    }


def queue(server: Server, name: str, now: float) -> dict:
    q = server.engine.queues[name]
    cfg = q.config
    out = plain(q.statistics(now))
    out.update(
        topic=cfg.name,
        message_type=cfg.message_type,
        kind=cfg.kind.value,
        underlying_topic=cfg.underlying,
        fairness=cfg.fairness.value,
        leasing=cfg.leasing.value,
        lease_period=_seconds(cfg.lease_period_s),
        expiration=_seconds(cfg.expiration_s),
        in_flight=out["backlog"] + out["awaiting_ack"],
        paged_chunks=q.paged_chunks,
        # held behind earlier messages of their OrderingKey (counted in ``available``)
        held_by_key=q.keys.held_count() if q.keys is not None else 0,
        **replicated_queue_metrics(server, name),
        settings=queue_settings(cfg),
    )
    return out


def queues(server: Server, now: float) -> dict:
    return {name: queue(server, name, now) for name in server.engine.queues}


def details(server: Server, name: str, now: float, limit: int = DETAILS_MESSAGES_DEFAULT,
            content_filter: str | None = None) -> dict:
    """The reference's ``details`` resource: ``cursors`` (the subscribers as the queue
    sees them) and ``messages`` (available, leased, and in a replicated queue owned
    elsewhere, with holder or owner, lease deadline and delivery count), at most
    ``limit`` available messages in position order. ``content_filter``: only the
    messages whose body matches it, at most ``limit`` of them (a browse: it examines the
    whole queue, and changes nothing). BadFilter (400) when it does not compile."""
    engine = server.engine
    q = engine.queues[name]
    flt = compile_filter(content_filter) if content_filter else None
    binding = engine.bindings.get(name)
    here = engine.instance if binding is not None and binding.ownership is not None else None
    d = q.details(limit=None if flt is not None else limit)
    truncated = d.truncated
    names = _client_names(server)

    def client(key):
        if isinstance(key, tuple) and len(key) == 2 and key[0] == "named":
            return f"named consumer {key[1]}"
        return names.get(key[0]) if isinstance(key, tuple) and key else None

    messages = []
    for r in d.messages:
        try:
            # peek: a browse reads the whole queue, and must not push the messages
            # deliveries read out of the cache (as a query, engine/sow/queries.py)
            entry = engine.cache.peek(r.position)
            bookmark = format_bookmark(entry.publisher, entry.seq, r.position)
        except Exception:  # noqa: BLE001 (a record retention removed, a damaged one: no bookmark)
            entry, bookmark = None, None
        if flt is not None:
            if entry is None or not poison.matches(flt, entry, bookmark, now, f"a browse of queue {name!r}"):
                continue
            if len(messages) >= limit:
                truncated = True
                break
        messages.append({
            "position": r.position, "bookmark": bookmark, "state": r.state, "published_at": r.published_at,
            "deliveries": r.deliveries, "cancels": r.cancels,
            "holder": consumer_label(r.holder) if r.holder is not None else None,
            "holder_client": client(r.holder) if r.holder is not None else None,
            "lease_deadline": r.lease_deadline, "priority": r.priority, "barrier": r.barrier,
            # the instance that owns it: another for a message owned elsewhere, this one
            # for the rest of a replicated queue, none for a queue that is not replicated
            "owner": r.holder if r.state == "elsewhere" else here,
            # a delayed retry (docs/queues.md): not offered before then (for a message owned
            # elsewhere, its owner's time); the application's last failure reason
            "not_before": r.not_before, "reason": r.reason or None,
        })
    cursors = [
        {"subscriber": consumer_label(key), "client": client(key), "outstanding": outstanding,
         "max_backlog": max_backlog}
        for key, outstanding, max_backlog in d.consumers
    ]
    return {
        "queue": name,
        "cursors": cursors,
        "messages": messages,
        "messages_truncated": truncated,
        "awaiting_ack": [{"position": p, "holder": consumer_label(k), "holder_client": client(k)}
                         for p, k in d.awaiting_ack],
    }


# --- clients and subscriptions --------------------------------------------------------------------


def _client_names(server: Server) -> dict[int, str | None]:
    return {cid: s.client_name for cid, s in server.engine.sessions.items()}


def client(server: Server, conn_id: int, now: float) -> dict | None:
    session = server.engine.sessions.get(conn_id)
    conn = server.connections.get(conn_id)
    if session is None or conn is None:
        return None
    transport = conn.transport
    peer = conn.peer
    return {
        "id": conn_id,
        "name": session.client_name,
        "user": session.user_id,
        "address": f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else str(peer),
        "transport": conn.config.name,
        "logged_on": session.logged_on,
        "connected_since": conn.connected_at,
        "connected_for": max(0.0, now - conn.connected_at),
        "last_heard": conn.last_heard,
        "subscriptions": len(session.subs),
        "bytes_in": conn.bytes_in,
        "bytes_out": conn.bytes_out,
        "messages_in": conn.messages_in,
        "messages_out": conn.messages_out,
        "unsent_bytes": transport.get_write_buffer_size() if transport is not None and not conn.closed else 0,
    }


def clients(server: Server, now: float) -> dict:
    out = {}
    for conn_id in server.engine.sessions:
        c = client(server, conn_id, now)
        if c is not None:
            out[str(conn_id)] = c
    return out


def subscriptions(server: Server) -> list[dict]:
    out = []
    for conn_id, session in server.engine.sessions.items():
        for sub in session.subs.values():
            row = {
                "client_id": conn_id,
                "client": session.client_name,
                "sub_id": sub.sub_id,
                "topic": sub.topic,
                "kind": sub.kind.value,
                "filter": sub.filter.source if sub.filter is not None else None,
            }
            if sub.kind is SubKind.QUEUE and sub.consumer is not None:
                row.update(outstanding=sub.consumer.outstanding, max_backlog=sub.consumer.max_backlog)
            elif sub.kind is SubKind.REPLAY:
                row.update(replaying=not sub.live, cursor=sub.cursor)
            out.append(row)
    return out


# --- replication ----------------------------------------------------------------------------------


def replication(server: Server, now: float) -> dict:
    outgoing, incoming = server.engine.replication.statistics(now)
    return {"outgoing": plain(outgoing), "incoming": plain(incoming)}


def catch_up(server: Server, now: float) -> dict:
    """The wait for the sync peers to catch this instance up after its start
    (docs/replication.md, "After a restart: catching up"), and whether clients are
    refused meanwhile (``--no-clients-until-replicated``)."""
    return {**plain(server.engine.catch_up.statistics(now)), "clients_held": server.clients_held}
