"""One error hierarchy for the whole of conveyor, split by who is at fault.

Every error has a stable ``code`` (a short snake_case string). The server sends the
code in a failed ack; the client maps it back to the same class with
:func:`error_for_code`. A code never changes meaning; new codes are only added.

- :class:`ClientError`: the request was wrong (bad frame, unknown option, bad filter...).
  The connection stays usable unless the framing itself is broken.
- :class:`ServerError`: the server could not do something it should have been able to.
- :class:`ConfigError`: the configuration is invalid; the server refuses to start.
- :class:`JournalError`: the transaction log is damaged or cannot be written.
- :class:`ConnectionLost`: client side only: the connection closed or timed out.
"""

from __future__ import annotations


class ConveyorError(Exception):
    """Root of every conveyor error."""

    code = "error"

    def __init__(self, message: str = "", **details: object) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def __str__(self) -> str:
        return self.message or self.code


# --- the request was wrong ---------------------------------------------------------


class ClientError(ConveyorError):
    """The client sent something the server cannot accept."""

    code = "bad_request"


class ProtocolError(ClientError):
    """A frame or command could not be decoded (malformed bytes, missing header)."""

    code = "protocol_error"


class FrameTooLarge(ProtocolError):
    """A frame's declared length is over the configured limit; it was not buffered."""

    code = "frame_too_large"


class UnknownCommand(ClientError):
    code = "unknown_command"


class UnknownOption(ClientError):
    code = "unknown_option"


class InvalidOption(ClientError):
    """An option was recognised but its value is wrong."""

    code = "invalid_option"


class NotLoggedOn(ClientError):
    code = "not_logged_on"


class AlreadyLoggedOn(ClientError):
    code = "already_logged_on"


class NameInUse(ClientError):
    """Another user holds this client name (spec 002, "name in use")."""

    code = "name_in_use"


class NotAuthenticated(ClientError):
    """With ``Authentication`` on: a command before a successful logon, or a logon whose
    credentials were refused (the connection is then closed)."""

    code = "not_authenticated"


class NotEntitled(ClientError):
    """The authenticated user is not granted what the command needs (``details``:
    ``permission``, ``name``)."""

    code = "not_entitled"


class ClientReplaced(ClientError):
    """This connection was replaced by a newer logon of the same client name and user
    (spec 002, "name in use"); a client told so does not reconnect on its own."""

    code = "client_replaced"


class LimitExceeded(ClientError):
    """A limit of ``<Limits>`` (``details``: ``limit``, ``max``)."""

    code = "limit_exceeded"


class UnknownTopic(ClientError):
    code = "unknown_topic"


class NotATransactionLogTopic(ClientError):
    """The command needs a topic recorded in the transaction log."""

    code = "not_recorded"


class BadFilter(ClientError):
    """A content filter could not be parsed; ``details`` carry position and token."""

    code = "bad_filter"


class BadBookmark(ClientError):
    code = "bad_bookmark"


class UnknownSubscription(ClientError):
    code = "unknown_subscription"


class DuplicateSubscription(ClientError):
    code = "duplicate_subscription"


class NotLeaseHolder(ClientError):
    """An acknowledgement for a message leased to someone else, refused by ``Leasing``."""

    code = "not_lease_holder"


class MessageTooLarge(ClientError):
    code = "message_too_large"


class SlowConsumer(ClientError):
    """The connection's unsent output passed the configured cap."""

    code = "slow_consumer"


# --- the Spark connector's operations (docs/spark-server.md) --------------------------


class Fenced(ClientError):
    """A named consumer was claimed by a newer holder: this one's epoch is out of date."""

    code = "fenced"


class BadDeliveryRange(ClientError):
    """A delivery range the named consumer does not have (beyond D, or already acked)."""

    code = "bad_delivery_range"


class UnknownTxn(ClientError):
    """A transaction handle with nothing staged (never staged, committed, aborted,
    expired, or lost in a server restart)."""

    code = "unknown_txn"


class StagingFull(ClientError):
    """Staged rows would pass the server's staging limit."""

    code = "staging_full"


class DuplicateConflict(ClientError):
    """A duplicate (publisher, seq) whose fingerprint differs from the recorded one."""

    code = "duplicate_conflict"


class BadMessage(ClientError):
    """A message a SOW topic cannot keep: not JSON, or not an object where key fields
    are read from it (docs/sow-and-views.md)."""

    code = "bad_message"


class BadExpiration(ClientError):
    """A publish's expiration (``e``) that cannot be honoured: not a finite number of
    seconds >= 0, or on a topic where nothing keeps the message (docs/queues.md)."""

    code = "bad_expiration"


class BadTopic(ClientError):
    """A topic written as a regular expression that is not one (``orders.(eu``): refused
    with the pattern and the position where it stops being one (``details``:
    ``topic``, ``position``). Also a client's pattern that only a backtracking engine
    runs (a backreference, a lookaround): client patterns run on RE2, and the reason
    names the feature (``position`` None)."""

    code = "bad_topic"


class ReadOnlyTopic(ClientError):
    """A publish or ``sow_delete`` on a view: its records are computed, not published."""

    code = "read_only_topic"


# --- the server could not do it ------------------------------------------------------


class ServerError(ConveyorError):
    code = "server_error"


class ShuttingDown(ServerError):
    code = "shutting_down"


class ServerFailed(ServerError):
    """The server stopped itself: its background work (the journal writer, the timer)
    raised, so it could no longer persist or serve. Raised by ``Server.serve_forever``;
    ``__cause__`` is the original error."""

    code = "server_failed"


class NotAvailable(ServerError):
    """The server knows the request but cannot do it yet (an administrative action whose
    feature has not landed, such as proxied transfer before replicated queues)."""

    code = "not_available"


class BadReply(ServerError):
    """A reply from the server does not have the shape its command promises (client side:
    a server of another version, or a bug)."""

    code = "bad_reply"


# --- configuration and storage ------------------------------------------------------


class ConfigError(ConveyorError):
    """Invalid configuration. ``path`` is the element path, ``hint`` how to fix it."""

    code = "config_error"

    def __init__(self, message: str, *, path: str = "", hint: str = "") -> None:
        text = f"{path}: {message}" if path else message
        if hint:
            text = f"{text} (hint: {hint})"
        super().__init__(text, path=path, hint=hint)
        self.path = path
        self.hint = hint


class ReplicationRefused(ConveyorError):
    """Two instances' configurations break a replication rule together, or a peer
    cannot be served: the link is refused, with the rule and both instances named."""

    code = "replication_refused"


class JournalError(ConveyorError):
    code = "journal_error"


class JournalCorrupt(JournalError):
    """Corruption before the tail of the log: refuse to start (repair may truncate)."""

    code = "journal_corrupt"


# --- client side ---------------------------------------------------------------------


class ConnectionLost(ConveyorError):
    code = "connection_lost"


class DisconnectedByAdmin(ConnectionLost):
    """An administrator closed this connection on purpose (the admin interface's
    ``clients/ID/disconnect``, ``conveyor disconnect``). The server says so before it
    closes (docs/protocol.md, "Connection notices"); a client told so does not reconnect:
    waiting calls raise this, subscriptions end with it."""

    code = "disconnected_by_admin"


class TimedOut(ConveyorError):
    code = "timed_out"


class AlreadyAcknowledged(ConveyorError):
    """A queue message was acknowledged, cancelled or expired a second time (each
    message is settled once; the first call stands)."""

    code = "already_acknowledged"


class ClientStateError(ConveyorError):
    """The client's connection state was moved in a way its table does not allow (a bug
    in the client, not in the application)."""

    code = "client_state_error"


def _all_subclasses(cls: type[ConveyorError]) -> list[type[ConveyorError]]:
    out = [cls]
    for sub in cls.__subclasses__():
        out.extend(_all_subclasses(sub))
    return out


#: code -> class, one table for both sides of the wire.
ERROR_CLASSES: dict[str, type[ConveyorError]] = {c.code: c for c in _all_subclasses(ConveyorError)}


def error_for_code(code: str, message: str = "", **details: object) -> ConveyorError:
    """Rebuild the error the server reported; unknown codes become ServerError."""
    cls = ERROR_CLASSES.get(code, ServerError)
    if issubclass(cls, ConfigError):
        return ConfigError(message)
    err = cls(message, **details)
    return err
