"""The replication shell: sockets for the links between instances (docs/replication.md).

As thin as ``server/``: it connects, reconnects and moves link frames; every decision
(what to send, what to record, when a publish is persisted) is the engine's
(:mod:`conveyor.engine.replication`).
"""

from conveyor.replication.links import IncomingReplica, OutgoingLink

__all__ = ["IncomingReplica", "OutgoingLink"]
