"""Replication between instances: the transaction log shipped, resumed, deduplicated.

This package decides everything about replication; the shell (``server/links.py``
and ``server/``) only moves link frames between sockets and these methods. As a *source*,
it keeps one :class:`OutLink` per configured ``Destination``; as a *destination*, one
:class:`InLink` per instance connected to its incoming replication transport. Rules:

1. **What a destination gets.** Publishes recorded here whose topic matches one of the
   destination's ``Topic`` regexes: those published here, and those that arrived by
   replication from an instance whose group matches the destination's ``PassThrough``
   regex. Never a record that has already passed the destination (its ``path``), and
   only durable records (read back from the journal, never kept in memory: a slow
   destination costs the source nothing but its window of
   :data:`WINDOW_BYTES_MAX_DEFAULT`). Dead-letter publishes go as plain publishes (the
   expiry they carry is local). A transaction is never split across batches.
2. **What a destination keeps.** Each received publish is recorded with its origin
   (instance, group), its path, its publisher, sequence and original timestamp, through
   the same duplicate detection as a client's publish: ``(publisher, seq)`` is the
   message's identity everywhere, so a message that arrives twice (two paths, a resend
   after a reconnect, a publisher that failed over and published it again) is recorded
   once. After each batch a :class:`~conveyor.records.ReceivedRec` marks how far the
   source's journal is covered; it is durable only if the batch is, and recovery reads
   it back, so a link resumes exactly where the destination's disk says.
3. **Acknowledgements.** The destination acknowledges a batch once its records are
   durable; the source then knows the destination holds everything below ``through``.
4. **Sync.** A publish is persisted, for its publisher, once it is durable here and on
   every ``sync`` destination (:meth:`Replication.persisted_floor`); ``async``
   destinations are never waited for. A sync destination that is down holds persisted
   acks (the publisher's store keeps the messages). With ``DowngradeAge``, a sync
   destination whose oldest unacknowledged record is older than that is treated as
   async (logged), and as sync again once it is back under ``UpgradeAge``.
5. **Loops are impossible**: a record is never sent to an instance on its path, and a
   destination drops a record whose path or origin is itself; duplicate detection
   catches anything else.
6. **Queues.** A replicated message never enters a ``Queue`` or ``GroupLocalQueue``
   whose own topic is replicated (those queues follow message ownership); it enters
   every other queue of its topic, which delivers its own copy.
7. **Named consumers** of a queue that follows ownership (the Spark source's, engine/
   consumers.py rule 7): their lease, ack and claim records travel with the queue's
   records, as :class:`~conveyor.records.ConsumerReplicatedRec` naming messages by
   identity, so that a query can continue on a destination with its position.
8. **SOW topics.** A publish to a SOW topic travels like any publish (a delta publish
   is journaled merged, so the destination gets the full message) and changes the
   destination's record when durable there. A ``sow_delete`` travels when its topic
   matches, naming each deleted record by its SowKey and its identity (journal
   positions are local); the destination removes a key only if its current record is
   that publish. Record expiry is not replicated: every instance expires a record at
   the time stamped in its message. A view's records (journaled when the view feeds a
   queue) are never sent: every instance computes its own views.
9. **Gaps** are loud: when a destination needs records the source's retention has
   removed, the source sends what is left, says so in the batch, and both ends log it
   and count it.

The package, one concern per module (it exports nothing itself; imports name the module):

- :mod:`.route`: the route rule (rules 1 and 5), once: ``travels_on``, ``came_back``;
- :mod:`.links`: ``PeerLinks``, the tables of the links both ways (each link's state, ``OutLink`` and ``InLink``, sits beside the side that changes it);
- :mod:`.source`: ``ReplicationSource``, the source side (rules 1, 3, 4, 6-9 outgoing);
- :mod:`.sink`: ``ReplicationSink``, the destination side (rules 2, 3, 5-8 incoming);
- :mod:`.replication`: ``Replication``, the engine part that holds both and their profile;
- :mod:`.checks`: the configuration rules two instances break together (``check_pair``);
- :mod:`.ownership`: message ownership of replicated queues (``QueueOwnership``,
  ``ReplicatedQueues``);
- :mod:`.catch_up`: after a start, the wait for the ``sync`` peers to catch this
  instance up (``CatchUp``; each ``Hello`` says where its sender's journal ends), and
  :mod:`.held_delivery`, the queue delivery that holds the replicated queues meanwhile
  (``HeldDelivery``).
"""
