"""A ``sow_delete`` header read once and kept (engine/delivery.py, ``_read_ack_options``):
the same header on later acknowledgements means the same thing, a refused header is
refused every time, and what is kept stays bounded whatever the clients send."""

from __future__ import annotations

import pytest

from conveyor import errors
from conveyor.engine.delivery import ACK_OPTIONS_KEPT, ACK_OPTIONS_TEXT_MAX

from .engine_harness import Harness, config_xml, decode, queue_xml


def setup(n: int, backlog: int = 1) -> tuple[Harness, int]:
    h = Harness(config_xml(queue_xml("Q", Leasing="strict"), topics=("Work",)))
    pub = h.connect("pub")
    w = h.connect("w")
    h.subscribe(w, "Q", "s", options=f"max_backlog={backlog}")
    for i in range(n):
        h.publish(pub, "Work", {"i": i})
    h.commit()
    return h, w


def test_the_same_header_acknowledges_each_message_it_comes_with():
    h, w = setup(3)
    seen = []
    for _ in range(3):
        (msg,) = h.messages(w, "Q")
        seen.append(decode(msg)["i"])
        h.ack(w, "Q", msg, options="deliveries=[1]")
        h.commit()
    assert seen == [0, 1, 2]
    assert h.messages(w, "Q") == []  # nothing left to offer


def test_a_kept_cancel_header_cancels_again():
    h, w = setup(1)
    for _ in range(2):
        (msg,) = h.messages(w, "Q")
        h.ack(w, "Q", msg, options='cancel,reason="busy"')
        h.commit()
    (msg,) = h.messages(w, "Q")
    assert decode(msg)["i"] == 0  # cancelled twice, offered a third time


def test_a_refused_header_is_refused_every_time():
    h, w = setup(1)
    (msg,) = h.messages(w, "Q")
    for _ in range(2):
        with pytest.raises(errors.InvalidOption, match="cancel and expire"):
            h.engine.delivery.sow_delete(w, _ack(msg.bookmark, "cancel,expire"), h.now)
    h.ack(w, "Q", msg)
    h.commit()
    assert h.messages(w, "Q") == []  # nothing left to offer


def test_kept_headers_are_bounded():
    h, w = setup(1)
    delivery = h.engine.delivery
    for k in range(ACK_OPTIONS_KEPT + 10):  # unknown bookmarks: each header read, nothing changes
        delivery.sow_delete(w, _ack(f"9|{k + 1}|{10**9 + k}", f'expire,reason="r{k}"'), h.now)
        assert len(delivery._ack_options) <= ACK_OPTIONS_KEPT
    long_reason = "x" * ACK_OPTIONS_TEXT_MAX
    delivery.sow_delete(w, _ack("9|1|77", f'expire,reason="{long_reason}"'), h.now)
    assert f'expire,reason="{long_reason}"' not in delivery._ack_options


def _ack(bookmark: str, options: str):
    from conveyor.protocol import messages as m

    return m.SowDelete(topic="Q", bookmark=bookmark, options=options)
