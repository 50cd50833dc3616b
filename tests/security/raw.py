"""A raw protocol session for the security tests: any command, in any order, and the
server's exact answer (the real clients would refuse to send some of them)."""

from __future__ import annotations

import itertools
import socket
import ssl

from conveyor.protocol import messages as m
from conveyor.protocol.codec import MessageDecoder, encode_frame

TIMEOUT_S = 20.0


class Closed(Exception):
    """The server closed the connection."""


class Raw:
    def __init__(self, port: int, *, tls: ssl.SSLContext | None = None, host: str = "127.0.0.1",
                 source: str | None = None) -> None:
        """``source``: the local address to connect from (any 127.x.y.z on Linux loopback)."""
        sock = socket.create_connection((host, port), timeout=TIMEOUT_S,
                                        source_address=(source, 0) if source else None)
        self.sock = tls.wrap_socket(sock, server_hostname=host) if tls is not None else sock
        self.decoder = MessageDecoder()
        self.items: list = []
        self.cids = itertools.count(1)

    def cid(self) -> str:
        return f"t{next(self.cids)}"

    def send(self, *commands) -> None:
        self.sock.sendall(encode_frame(list(commands)))

    def next(self):
        while not self.items:
            try:
                data = self.sock.recv(1 << 20)
            except (ConnectionError, ssl.SSLError, OSError) as exc:
                raise Closed(str(exc)) from None
            if not data:
                raise Closed("closed")
            self.decoder.receive_data(data)
            self.items.extend(self.decoder.next_items())
        return self.items.pop(0)

    def ack(self, cid: str, kinds=("processed",)) -> m.Ack:
        """The first ack of ``cid`` of one of ``kinds``, or its failure."""
        while True:
            item = self.next()
            if isinstance(item, m.Ack) and item.cid == cid and (item.ack_type in kinds or item.status == "failure"):
                return item

    def call(self, cmd, kinds=("processed",)) -> m.Ack:
        self.send(cmd)
        return self.ack(cmd.cid, kinds)

    def logon(self, name: str, user: str | None, password: str | None) -> m.Ack:
        return self.call(m.Logon(client_name=name, cid=self.cid(), ack_type="processed", user_id=user, password=password))

    def closed(self) -> bool:
        """Whether the server closed the connection (reading what is left)."""
        try:
            while True:
                self.next()
        except Closed:
            return True
        except TimeoutError:
            return False

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
