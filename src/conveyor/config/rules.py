"""Rules that tie sections together: queues and actions against the transaction log.

Each section reader has already checked its own elements; these rules run last, on the
typed values, and name the element that has to change:

1. Queues and actions need a ``TransactionLog``.
2. A literal underlying topic (the queue's ``UnderlyingTopic``, or its ``Name`` when
   there is none) must be recorded by a ``TransactionLog/Topic`` (literal or regex)
   with the queue's ``MessageType``: the queue is a view over the recorded messages.
3. For a regex underlying topic the set of matching topics is open, so only its
   ``DefaultPublishTarget`` (if any) is checked: it must be recorded likewise.
   (That it matches the ``UnderlyingTopic`` was checked when the queue was read.)
4. An action's On ``Topic`` must be a configured queue with the same ``MessageType``,
   or a recorded topic; its Do ``Topic`` must be recorded with the Do's
   ``MessageType``, so the dead-letter publish is journaled like any other.
5. A ``LocalQueue`` topic must not be replicated (reference A.1: AMPS reports an error).
6. A SOW topic must be recorded by a ``TransactionLog/Topic`` with its ``MessageType``:
   its records are a fold over the log (docs/sow-and-views.md).
7. A ``FileBackedMetadata`` queue cannot take from a SOW topic with ``Expiration``: its
   snapshots do not keep the per-message expiration stamped on such messages.
8. A replicated queue (a ``Queue`` or ``GroupLocalQueue`` a destination replicates) does
   not take from a view: a view's records are computed on every instance and never
   replicated, so each instance would hold its own copies of the same work under
   different identities. ``conveyor config check`` and ``conveyor serve`` refuse it alike.
9. A destination that replicates a queue (a ``Queue`` or ``GroupLocalQueue`` whose name
   one of its ``Topic`` elements matches) must replicate the queue's underlying topic too (a
   ``Topic`` whose name is the ``UnderlyingTopic``, or a regex that matches it): the
   queue's messages are the underlying topic's, and without them the queue on the other
   instance would hold acknowledgements and transfers for messages it never gets. The
   same test as the handshake's (engine/replication/checks.py), on this instance's
   configuration alone; the rules that need the peer's stay at the handshake.
10. (docs/configuration.md rule 29) A destination ``Topic`` may have a ``Filter`` (reference E.1: only the messages that
   match it are replicated there); it must compile, and must not filter a topic that
   carries a replicated queue (its name or its underlying topic): ownership, transfers
   and acknowledgements need every copy of the queue to hold every message.
"""

from __future__ import annotations

from conveyor import expr
from conveyor.config.model import (
    Action,
    OnPublish,
    QueueConfig,
    QueueKind,
    Replication,
    TransactionLog,
    ViewConfig,
    is_regex_topic,
    topic_matcher,
)
from conveyor.config.tree import Document


def check(
    doc: Document,
    txlog: TransactionLog | None,
    queues: tuple[QueueConfig, ...],
    actions: tuple[Action, ...],
    replication: Replication | None,
    sow=None,
) -> None:
    topics = sow.topics if sow is not None else ()
    if txlog is None:
        _require_transaction_log(doc, queues, actions)
        if topics:
            t = topics[0]
            raise doc.error(
                t.path, f"SOW topic {t.name!r} needs a <TransactionLog>: its records are kept in the log",
                f"add <TransactionLog> with a <JournalDirectory> and a <Topic> recording {t.name!r} "
                f"(message type {t.message_type})",
            )
        if replication is not None and replication.destinations:
            raise doc.error(
                "AMPSConfig/Replication",
                "replication needs a <TransactionLog>: what replicates is the transaction log",
                "add <TransactionLog> with a <JournalDirectory> and a <Topic> for every replicated topic",
            )
        return  # nothing else to check: with no queues and no actions, rules 2-4 are void
    for queue in queues:
        _check_queue(doc, txlog, queue)
    for topic in topics:
        _require_recorded(doc, txlog, topic.name, topic.message_type, topic.path,
                          "a SOW topic (its records are kept in the transaction log)")
    expiring = [t for t in topics if t.expiration]
    for queue in queues:
        if queue.file_backed_metadata:
            for t in expiring:
                if queue.takes_from(t.name):
                    raise doc.error(
                        f"{queue.path}/FileBackedMetadata",
                        f"queue {queue.name!r} keeps FileBackedMetadata snapshots, which do not keep the "
                        f"expiration SOW topic {t.name!r} stamps on its messages",
                        "remove <FileBackedMetadata>, or <Expiration> from the SOW topic",
                    )
    by_name = {q.name: q for q in queues}
    for action in actions:
        _check_action(doc, txlog, by_name, action)
    if replication is not None:
        _check_local_queues_not_replicated(doc, queues, replication)
        _check_replicated_queues(doc, queues, replication, sow.views if sow is not None else ())
        _check_underlying_replicated(doc, queues, replication)
        _check_filtered_topics(doc, queues, replication)


def _require_transaction_log(
    doc: Document, queues: tuple[QueueConfig, ...], actions: tuple[Action, ...]
) -> None:
    if queues:
        q = queues[0]
        raise doc.error(
            q.path,
            f"queue {q.name!r} needs a <TransactionLog>: queues are views over recorded "
            "messages",
            f"add <TransactionLog> with a <JournalDirectory> and a <Topic> recording "
            f"{q.underlying!r} (message type {q.message_type})",
        )
    if actions:
        a = actions[0]
        if isinstance(a.on, OnPublish):
            raise doc.error(f"{a.path}/On/Options/Topic", "a proxied-transfer action needs a <TransactionLog>",
                            "proxied transfer applies to replicated queues, which need one")
        raise doc.error(
            f"{a.path}/Do[1]/Options/Topic",
            "an action publish needs a <TransactionLog> to be journaled",
            f"add <TransactionLog> with a <JournalDirectory> and a <Topic> recording "
            f"{a.do[0].topic!r}",
        )


def _check_queue(doc: Document, txlog: TransactionLog, queue: QueueConfig) -> None:
    underlying_path = f"{queue.path}/UnderlyingTopic" if queue.underlying_topic else queue.path
    if not is_regex_topic(queue.underlying):
        _require_recorded(
            doc, txlog, queue.underlying, queue.message_type, underlying_path,
            f"the underlying topic of queue {queue.name!r}",
        )
    elif queue.default_publish_target is not None:
        _require_recorded(
            doc, txlog, queue.default_publish_target, queue.message_type,
            f"{queue.path}/DefaultPublishTarget",
            f"the DefaultPublishTarget of queue {queue.name!r}",
        )


def _check_action(
    doc: Document, txlog: TransactionLog, queues: dict[str, QueueConfig], action: Action
) -> None:
    on = action.on
    on_path = f"{action.path}/On/Options/Topic"
    if isinstance(on, OnPublish):
        _check_proxied_action(doc, txlog, queues, action)
        return
    queue = queues.get(on.topic)
    if queue is not None:
        if queue.message_type != on.message_type:
            raise doc.error(
                f"{action.path}/On/Options/MessageType",
                f"the action watches queue {on.topic!r} as {on.message_type!r}, but the "
                f"queue's MessageType is {queue.message_type!r}",
                f"write <MessageType>{queue.message_type}</MessageType>",
            )
    elif not _recorded_types(txlog, on.topic):
        known = ", ".join(sorted(queues)) or "none configured"
        raise doc.error(
            on_path,
            f"the action watches {on.topic!r}, which is neither a queue nor a recorded topic",
            f"name a configured queue (queues: {known})",
        )
    for i, do in enumerate(action.do, start=1):
        _require_recorded(
            doc, txlog, do.topic, do.message_type, f"{action.path}/Do[{i}]/Options/Topic",
            "the topic an action publishes to",
        )


def _check_proxied_action(
    doc: Document, txlog: TransactionLog, queues: dict[str, QueueConfig], action: Action
) -> None:
    """The control topic must be recorded (the action runs when its publish is durable),
    and each Do must name at least one queue that is not a LocalQueue."""
    on = action.on
    if not is_regex_topic(on.topic) and not _recorded_types(txlog, on.topic):
        raise doc.error(
            f"{action.path}/On/Options/Topic",
            f"the action watches {on.topic!r}, which is not recorded in the transaction log",
            f"record it: <TransactionLog><Topic><Name>{on.topic}</Name>...",
        )
    for i, do in enumerate(action.do, start=1):
        match = topic_matcher(do.queue)
        named = [q for q in queues.values() if match(q.name) and q.kind is not QueueKind.LOCAL]
        if not named:
            raise doc.error(
                f"{action.path}/Do[{i}]/Options/Topic",
                f"{do.queue!r} names no Queue or GroupLocalQueue: proxied transfer applies to replicated queues",
                f"queues: {', '.join(sorted(queues)) or 'none configured'}",
            )


def _check_local_queues_not_replicated(
    doc: Document, queues: tuple[QueueConfig, ...], replication: Replication
) -> None:
    local = [q for q in queues if q.kind is QueueKind.LOCAL]
    for d, dest in enumerate(replication.destinations, start=1):
        for t, topic in enumerate(dest.topics, start=1):
            for queue in local:
                if topic.message_type == queue.message_type and topic.matches(queue.name):
                    raise doc.error(
                        f"AMPSConfig/Replication/Destination[{d}]/Topic[{t}]/Name",
                        f"destination {dest.name!r} replicates LocalQueue {queue.name!r}, "
                        "which exists on this instance only",
                        "replicate the queue's underlying topics instead, or declare the "
                        "queue as <Queue> or <GroupLocalQueue>",
                    )


def _check_replicated_queues(
    doc: Document, queues: tuple[QueueConfig, ...], replication: Replication, views: tuple[ViewConfig, ...]
) -> None:
    """Rule 8."""
    replicated = replication.replicated_queues(queues)
    for queue in queues:
        if queue.name not in replicated:
            continue
        over_view = next((v.name for v in views if topic_matcher(queue.underlying)(v.name)), None)
        if over_view is not None:
            raise doc.error(
                queue.path,
                f"queue {queue.name!r} is replicated and its underlying topic is view {over_view!r}: not supported "
                "together",
                "make the queue a LocalQueue, or leave it out of the destinations' Topic regexes",
            )


def _check_underlying_replicated(doc: Document, queues: tuple[QueueConfig, ...], replication: Replication) -> None:
    """Rule 9."""
    for d, dest in enumerate(replication.destinations, start=1):
        names = tuple(t.name for t in dest.topics)
        matchers = [topic_matcher(n) for n in names]
        for queue in queues:
            if queue.kind is QueueKind.LOCAL or not any(m(queue.name) for m in matchers):
                continue
            if queue.underlying in names or any(m(queue.underlying) for m in matchers):
                continue
            raise doc.error(
                f"AMPSConfig/Replication/Destination[{d}]",
                f"destination {dest.name!r} replicates queue {queue.name!r} ({queue.path}) but not its underlying "
                f"topic {queue.underlying!r}: the queue's messages would not reach {dest.name!r}",
                f"add <Topic><Name>{queue.underlying}</Name><MessageType>{queue.message_type}</MessageType></Topic> "
                "to this destination, or make the queue a <LocalQueue>",
            )


def _check_filtered_topics(doc: Document, queues: tuple[QueueConfig, ...], replication: Replication) -> None:
    """Rule 10."""
    for d, dest in enumerate(replication.destinations, start=1):
        for t, topic in enumerate(dest.topics, start=1):
            if topic.filter is None:
                continue
            path = f"AMPSConfig/Replication/Destination[{d}]/Topic[{t}]/Filter"
            try:
                expr.compile(topic.filter)
            except expr.ExpressionError as exc:
                raise doc.error(path, f"invalid Filter: {exc}") from None
            for queue in queues:
                if queue.kind is QueueKind.LOCAL or not (topic.matches(queue.name) or topic.matches(queue.underlying)):
                    continue
                raise doc.error(
                    path,
                    f"destination {dest.name!r} filters topic {topic.name!r}, which carries replicated queue "
                    f"{queue.name!r} ({queue.path}): a message the filter keeps back would be owned by an instance "
                    f"{dest.name!r} never hears of, and its acknowledgements and transfers would name messages "
                    f"{dest.name!r} does not have",
                    "replicate the queue's topics without a Filter (filter other topics), or make the queue a "
                    "<LocalQueue>",
                )


def _require_recorded(
    doc: Document, txlog: TransactionLog, topic: str, message_type: str, path: str, what: str
) -> None:
    types = _recorded_types(txlog, topic)
    if message_type in types:
        return
    if not types:
        raise doc.error(
            path,
            f"{what}, {topic!r}, is not recorded in the transaction log",
            f"add <Topic><Name>{topic}</Name><MessageType>{message_type}</MessageType>"
            "</Topic> to <TransactionLog>",
        )
    raise doc.error(
        path,
        f"{what}, {topic!r}, is recorded as {', '.join(sorted(types))}, not {message_type!r}",
        f"record {topic!r} with <MessageType>{message_type}</MessageType>, or use the "
        "same message type here",
    )


def _recorded_types(txlog: TransactionLog, topic: str) -> set[str]:
    return {t.message_type for t in txlog.topics if t.matches(topic)}
