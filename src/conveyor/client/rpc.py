"""A small blocking request/answer client for the Spark connector's operations.

:class:`conveyor.Client` is built for applications: a loop thread, reconnection,
publish stores. The Spark connector needs something else: a few calls per micro-batch
from processes Spark creates and kills at will, and objects that are pickled. Rules:

1. **No thread, no event loop, no background work.** One socket, used only while a
   method runs. It connects (and logs on) lazily, on the first call, so an ``RpcClient``
   can be created anywhere; still, create it inside methods of Spark objects, never in
   their ``__init__`` (Spark pickles them and ships them to other processes).
2. **At most one retry.** A lost connection raises :class:`~conveyor.errors.ConnectionLost`
   and the next call connects again; Spark retries tasks and the operator restarts
   queries. Only a single-answer command on a connection that was already open (which
   the server may have closed while it was idle) is retried once on a new connection.
   Those commands are safe to repeat: a repeated lease re-offers what the first one
   leased, acks and extends are idempotent, commits are deduplicated. ``stage`` is never
   repeated (staged rows add up): it fails, and the Spark task with it.
3. **A failure Ack raises** the exception of its code (:func:`conveyor.errors.error_for_code`).
4. Frames stay below the server's frame limit: ``stage`` and ``publish_batch`` split
   large row lists.
5. **Typed replies.** Every named-consumer and transaction call returns the struct of
   :mod:`conveyor.protocol.replies` for its command, decoded at this seam: a reply of
   the wrong shape raises :class:`~conveyor.errors.BadReply` here, not a ``KeyError``
   deep inside a Spark task.
6. **A list of servers.** ``server`` may name several instances, comma separated
   (``tcp://a:9007,tcp://b:9007``). A connection goes to the first one that accepts it,
   trying them in order from the one that last worked; a lost connection moves on the
   same way at the next connect. Nothing is replayed on the new instance beyond rule 2:
   the state the calls rely on (a named consumer's deliveries, acked pointer and epoch,
   publishers' highest sequences) is journaled, while staged rows are not and fail the
   commit with ``unknown_txn`` (docs/spark.md, "Failover between instances").
7. **Credentials and TLS** as for :class:`~conveyor.client.Client`: ``tcps://`` URIs,
   ``user:password@`` in the URI, the ``user_id``/``password`` arguments or the
   environment (:mod:`conveyor.client.endpoints`); a password never appears in a
   message, a log line or a ``repr``.
8. **An HTTP answer** to the logon (an HTTP port given as the server) raises
   :class:`~conveyor.errors.ConnectionLost` saying so at once, as the client does.
"""

from __future__ import annotations

import hashlib
import itertools
import socket
import ssl
import uuid
from collections.abc import Iterable, Iterator, Sequence


from conveyor import errors
from conveyor.client.endpoints import Endpoint, parse_endpoint
from conveyor.protocol import messages as m
from conveyor.protocol import replies as r
from conveyor.protocol.bookmarks import bookmark_position
from conveyor.protocol.codec import MessageDecoder, encode_frame, http_response_start

FRAME_BYTES_TARGET = 4 * 1024 * 1024  # well under the server's 16 MiB default limit
ROWS_PER_FRAME_MAX = 5000
RECV_BYTES = 1 << 20


def parse_servers(servers: str) -> list[tuple[str, Endpoint]]:
    """``"tcp://a:1,tcp://b:2"`` -> [(uri as shown, endpoint), ...]; ClientError if none or
    one is malformed. The URI as shown has no password (rule 7)."""
    uris = [u.strip() for u in servers.split(",") if u.strip()]
    if not uris:
        raise errors.ClientError("no server URI given (e.g. tcp://127.0.0.1:9007, or several, comma separated)")
    endpoints = [parse_endpoint(u) for u in uris]
    return [(e.display, e) for e in endpoints]


def fingerprint(data: bytes) -> int:
    """The payload hash sent with a direct-mode publish: 63 bits, never 0 (0 = none)."""
    return (int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big") >> 1) or 1


def _chunks(rows: Sequence[bytes], overhead: int = 16) -> Iterator[tuple[int, int]]:
    """(start, end) index ranges whose rows add up to at most FRAME_BYTES_TARGET bytes."""
    start, size = 0, 0
    for i, row in enumerate(rows):
        size += len(row) + overhead
        if i > start and (size > FRAME_BYTES_TARGET or i - start >= ROWS_PER_FRAME_MAX):
            yield start, i
            start, size = i, len(row) + overhead
    if start < len(rows):
        yield start, len(rows)


class RpcClient:
    """Blocking calls to one conveyor server; see the module rules."""

    def __init__(self, server: str, *, client_name: str | None = None, timeout: float = 30.0,
                 user_id: str | None = None, password: str | None = None, ca_file: str | None = None,
                 cert_file: str | None = None, key_file: str | None = None) -> None:
        self.servers = parse_servers(server)
        self.user_id = user_id
        self._password = password
        self.ca_file, self.cert_file, self.key_file = ca_file, cert_file, key_file
        self._at = 0  # index of the server that last accepted a connection (rule 6)
        self.client_name = client_name or f"conveyor-rpc-{uuid.uuid4().hex[:12]}"
        self.timeout = timeout
        self._sock: socket.socket | None = None
        self._decoder = MessageDecoder()
        self._items: list = []
        self._head: bytes | None = b""  # a connection's first bytes, until told apart from HTTP (rule 8)
        self._cids = itertools.count(1)

    # --- connection --------------------------------------------------------------------

    def __enter__(self) -> RpcClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass

    @property
    def server(self) -> str:
        """The URI of the instance in use (or tried last)."""
        return self.servers[self._at][0]

    def _connected(self) -> socket.socket:
        if self._sock is not None:
            return self._sock
        failures = []
        for i in range(len(self.servers)):  # rule 6: from the last that worked, in order
            at = (self._at + i) % len(self.servers)
            uri, endpoint = self.servers[at]
            try:
                sock = socket.create_connection((endpoint.host, endpoint.port), timeout=self.timeout)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if endpoint.tls:
                    sock = self._tls(endpoint).wrap_socket(sock, server_hostname=endpoint.host)
            except ssl.SSLCertVerificationError as exc:
                failures.append(f"{uri}: the server's certificate was refused: {exc.verify_message or exc}")
                continue
            except OSError as exc:
                failures.append(f"{uri}: {exc}")
                continue
            self._at = at
            break
        else:
            raise errors.ConnectionLost(f"cannot connect to {'; '.join(failures)}")
        self._sock, self._decoder, self._items, self._head = sock, MessageDecoder(), [], b""
        user, password = endpoint.credentials(self.user_id, self._password)
        logon = m.Logon(client_name=self.client_name, cid=self._cid(), ack_type="processed", user_id=user,
                        password=password)
        try:
            self._send([logon])
            self._wait(logon.cid)
        except errors.ConveyorError:
            self.close()
            raise
        return sock

    def _tls(self, endpoint: Endpoint) -> ssl.SSLContext:
        from conveyor.security.tls import client_context

        try:
            return client_context(ca_file=endpoint.ca_file or self.ca_file, cert_file=endpoint.cert_file or self.cert_file,
                                  key_file=endpoint.key_file or self.key_file)
        except ssl.SSLError as exc:
            raise errors.ClientError(f"cannot use the TLS files for {endpoint.display}: {exc}") from None

    def _cid(self) -> str:
        return f"r{next(self._cids)}"

    def _send(self, commands: list) -> None:
        sock = self._connected()
        try:
            sock.sendall(encode_frame(commands))
        except OSError as exc:
            self.close()
            raise errors.ConnectionLost(f"lost {self.server}: {exc}") from None

    def _next_item(self):
        """The next message from the server (blocking up to ``timeout``)."""
        while not self._items:
            sock = self._sock
            if sock is None:
                raise errors.ConnectionLost(f"not connected to {self.server}")
            try:
                data = sock.recv(RECV_BYTES)
            except TimeoutError:
                self.close()
                raise errors.TimedOut(f"{self.server} did not answer within {self.timeout}s") from None
            except OSError as exc:
                self.close()
                raise errors.ConnectionLost(f"lost {self.server}: {exc}") from None
            if not data:
                self.close()
                raise errors.ConnectionLost(f"{self.server} closed the connection")
            if self._head is not None:
                data = self._head + data
                verdict = http_response_start(data)
                self._head = data if verdict is None else None
                if verdict is None:
                    continue
                if verdict:
                    self.close()
                    raise errors.ConnectionLost(f"{self.server} answered in HTTP: that is an HTTP port (the admin "
                                                "interface?), not conveyor's client port")
            self._decoder.receive_data(data)
            self._items = self._decoder.next_items()
            self._items.reverse()  # pop() from the end = in order
        return self._items.pop()

    @staticmethod
    def _raise(ack: m.Ack) -> None:
        code = ack.code or "server_error"
        err = errors.error_for_code(code, ack.reason or "", **(ack.details or {}))
        if err.code != code:
            err.code = code  # a code this version has no class for: keep it visible
        raise err

    def _wait(self, cid: str) -> m.Ack:
        """The processed Ack of ``cid``; raises its error if it failed."""
        while True:
            item = self._next_item()
            if isinstance(item, m.Ack) and item.cid == cid and (item.ack_type == "processed" or item.status == "failure"):
                if item.status == "failure":
                    self._raise(item)
                return item

    def _call(self, cmd) -> m.Ack:
        """One command, one answer. On a connection that was already open (it may have
        been closed while idle, e.g. by IdleTimeout), a lost connection is retried once on
        a new one: every command sent this way is safe to repeat (rule 2)."""
        reused = self._sock is not None
        if not reused:
            self._connected()
        try:
            self._send([cmd])
            return self._wait(cmd.cid)
        except errors.ConnectionLost:
            if not reused:
                raise
        self._connected()
        self._send([cmd])
        return self._wait(cmd.cid)

    def _reply(self, cmd, reply_type: type[r.R]) -> r.R:
        return r.decode(self._call(cmd).result, reply_type)

    # --- named consumers (docs/spark-server.md) ------------------------------------------

    def claim(self, queue: str, consumer: str, token: str) -> r.ClaimReply:
        """Fence every older holder of the consumer: a new epoch."""
        return self._reply(m.Claim(queue=queue, consumer=consumer, token=token, cid=self._cid()), r.ClaimReply)

    def lease(
        self, queue: str, consumer: str, after: int, max: int, ttl: float, upto: int | None = None, epoch: int = 0
    ) -> r.LeaseReply:
        cmd = m.Lease(queue=queue, consumer=consumer, after=after, max=max, ttl=ttl, upto=upto, epoch=epoch, cid=self._cid())
        return self._reply(cmd, r.LeaseReply)

    def fetch(self, queue: str, consumer: str, lo: int, hi: int, page: int = 10000) -> Iterator[m.Message]:
        """The messages of deliveries ``lo < d <= hi`` in d order, ``page`` deliveries per
        request, with the next page requested before this one is read (the server builds
        it while the caller works). Abandoning the iterator closes the connection (unread
        data would follow)."""
        for item in self._fetch(queue, consumer, lo, hi, page, columns=False):
            if isinstance(item, m.Message):
                yield item

    def fetch_pages(self, queue: str, consumer: str, lo: int, hi: int, page: int = 10000, *, packed: bool = False
                    ) -> Iterator[m.FetchPage | m.FetchPacked]:
        """:meth:`fetch`, column by column: the same deliveries as :class:`FetchPage`
        objects, each holding a run of them in d order (no object per message); with
        ``packed``, as :class:`FetchPacked` pages (one buffer per field) from a server
        that has them. A server that answers message by message (an older release) is
        read the same, as FetchPage."""
        rows: list[m.Message] = []
        for item in self._fetch(queue, consumer, lo, hi, page, columns=True, packed=packed):
            if isinstance(item, (m.FetchPage, m.FetchPacked)):
                yield item
            else:
                rows.append(item)
                if len(rows) >= page:
                    yield _as_page(rows)
                    rows = []
        if rows:
            yield _as_page(rows)

    def _fetch(self, queue: str, consumer: str, lo: int, hi: int, page: int, *, columns: bool, packed: bool = False
               ) -> Iterator[m.Message | m.FetchPage | m.FetchPacked]:
        pages = [(a, min(hi, a + max(1, page))) for a in range(lo, hi, max(1, page))]
        if not pages:
            return
        if self._sock is None:
            self._connected()
        inflight: list[str] = []

        def request(i: int) -> None:
            cid = self._cid()
            self._send([m.Fetch(queue=queue, consumer=consumer, lo=pages[i][0], hi=pages[i][1], cid=cid,
                                columns=columns, packed=packed)])
            inflight.append(cid)

        finished = False
        try:
            request(0)
            for i in range(len(pages)):
                if i + 1 < len(pages):
                    request(i + 1)
                cid = inflight.pop(0)
                while True:
                    item = self._next_item()
                    if isinstance(item, (m.Message, m.FetchPage, m.FetchPacked)):
                        if item.query_id == cid:
                            yield item
                    elif isinstance(item, m.Ack) and item.cid == cid:
                        if item.status == "failure":
                            self._raise(item)
                        if item.ack_type == "processed":
                            r.decode(item.result, r.FetchDone)
                            break
            finished = True
        finally:
            if not finished:
                self.close()

    def _call_start(self, cmd) -> None:
        if self._sock is None:
            self._connected()
        self._send([cmd])

    def ack_through(self, queue: str, consumer: str, d: int, epoch: int = 0) -> r.AckThroughReply:
        """Cumulative and idempotent."""
        return self._reply(m.AckThrough(queue=queue, consumer=consumer, d=d, epoch=epoch, cid=self._cid()), r.AckThroughReply)

    def extend(self, queue: str, consumer: str, ttl: float, epoch: int = 0) -> r.ExtendReply:
        """Renew every unacked lease of the consumer."""
        return self._reply(m.Extend(queue=queue, consumer=consumer, ttl=ttl, epoch=epoch, cid=self._cid()), r.ExtendReply)

    def reclaim(self, queue: str, consumer: str, lo: int, hi: int, ttl: float, epoch: int = 0) -> r.ReclaimReply:
        """Renew the leases of deliveries ``lo < d <= hi`` (a replayed batch)."""
        cmd = m.Reclaim(queue=queue, consumer=consumer, lo=lo, hi=hi, ttl=ttl, epoch=epoch, cid=self._cid())
        return self._reply(cmd, r.ReclaimReply)

    def head(self, queue: str) -> r.HeadReply:
        """``upto``: the journal position bounding what is queued now (AvailableNow)."""
        return self._reply(m.Head(queue=queue, cid=self._cid()), r.HeadReply)

    def consumer_info(self, queue: str, consumer: str) -> r.ConsumerInfoReply:
        return self._reply(m.ConsumerInfo(queue=queue, consumer=consumer, cid=self._cid()), r.ConsumerInfoReply)

    # --- the journal over the network (docs/spark-journal.md) ---------------------------

    def journal_segments(self) -> r.JournalSegmentsReply:
        """The journal's identity and its segment files as the server can serve them."""
        return self._reply(m.JournalSegments(cid=self._cid()), r.JournalSegmentsReply)

    def journal_read(self, base: int, offset: int, n: int, journal: str) -> bytes:
        """Up to ``n`` bytes of segment ``base`` from file offset ``offset`` (fewer at its
        readable end, and at most the server's chunk per call), from journal ``journal``."""
        cmd = m.JournalRead(base=base, offset=offset, n=n, journal=journal, cid=self._cid())
        return self._reply(cmd, r.JournalChunk).data

    # --- staged transactions ----------------------------------------------------------

    def stage(self, txn: str, topic: str, rows: Sequence[bytes]) -> int:
        """Stage ``rows`` under ``txn`` (several frames if large); returns the total staged."""
        commands = [
            m.Stage(txn=txn, topic=topic, rows=list(rows[a:b]), cid=self._cid()) for a, b in _chunks(rows)
        ]
        if not commands:
            return 0
        staged = 0
        for cmd in commands:  # pipelined: every frame goes out, then the answers are read
            self._call_start(cmd)
        for cmd in commands:
            staged = r.decode(self._wait(cmd.cid).result, r.StageReply).staged
        return staged

    def commit_txn(
        self, publisher: str, seq: int, txns: Iterable[str], fences: Iterable[m.ConsumerFence] = ()
    ) -> tuple[str, r.CommitReply]:
        """Publish everything staged under ``txns`` as one unit; ("published" or
        "duplicate", the reply). With ``fences``, the server first checks that each
        named consumer is still at the epoch given (``fenced`` otherwise, nothing
        published) and acknowledges its deliveries through ``through`` in the same step."""
        cmd = m.CommitTxn(publisher=publisher, seq=seq, txns=list(txns), fences=list(fences), cid=self._cid())
        ack = self._call(cmd)
        return ("duplicate" if ack.status == "duplicate" else "published"), r.decode(ack.result, r.CommitReply)

    def abort_txn(self, txns: Iterable[str]) -> int:
        return self._reply(m.AbortTxn(txns=list(txns), cid=self._cid()), r.AbortReply).discarded

    # --- direct publishing ------------------------------------------------------------

    def publish_batch(
        self,
        topic: str,
        rows: Sequence[bytes],
        *,
        first_seq: int | None = None,
        seqs: Sequence[int] | None = None,
        fingerprints: Sequence[int] | None = None,
    ) -> tuple[int, int]:
        """Publish ``rows`` under this client's name with explicit, increasing sequence
        numbers (``first_seq + i`` or ``seqs``) and payload fingerprints (computed if not
        given); wait until every one is persisted or answered as a duplicate.
        Returns (accepted, duplicates); a conflicting duplicate raises."""
        n = len(rows)
        if n == 0:
            return 0, 0
        if seqs is None:
            if first_seq is None:
                raise ValueError("publish_batch needs first_seq or seqs")
            seqs = range(first_seq, first_seq + n)
        if fingerprints is None:
            fingerprints = [fingerprint(r) for r in rows]
        if self._sock is None:
            self._connected()
        for a, b in _chunks(rows):
            self._send([
                m.Publish(topic=topic, data=rows[i], seq=seqs[i], ack_type="persisted", fingerprint=fingerprints[i])
                for i in range(a, b)
            ])
        # Persisted acks are conflated (one covers every sequence up to its own);
        # duplicates are answered one by one. Done when every sequence is covered.
        ordered = sorted(seqs)
        duplicates: set[int] = set()
        persisted = -1
        at = 0
        while at < n:
            item = self._next_item()
            if not isinstance(item, m.Ack):
                continue
            if item.status == "failure":
                # Any kind: a publish refused before it is journaled (not JSON, not
                # entitled...) is answered with a processed ack, never a persisted one.
                self._raise(item)
            if item.ack_type != "persisted" or item.seq is None:
                continue
            if item.status == "duplicate":
                duplicates.add(item.seq)
            elif item.status == "success":
                persisted = max(persisted, item.seq)
            while at < n and (ordered[at] in duplicates or ordered[at] <= persisted):
                at += 1
        return n - len(duplicates), len(duplicates)


def _as_page(rows: list[m.Message]) -> m.FetchPage:
    """Messages of consecutive deliveries (a server without columnar fetch) as one page."""
    return m.FetchPage(
        query_id=rows[0].query_id, queue=rows[0].queue or "", lo=(rows[0].delivery or 1) - 1,
        data=[x.data for x in rows], topics=[x.topic for x in rows], publishers=[x.publisher or 0 for x in rows],
        seqs=[x.seq or 0 for x in rows], timestamps=[x.timestamp or 0.0 for x in rows],
        positions=[bookmark_position(x.bookmark or "") for x in rows],
        correlation_ids=[x.correlation_id for x in rows],
    )
