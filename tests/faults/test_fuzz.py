"""Hypothesis fuzzing of the parsers that take input from outside: the protocol decoder
(all the way into the engine), the configuration loader, the expression compiler, the
JSON bodies of messages (depth, size, invalid UTF-8, huge numbers: protocol/payload.py)
through every stage that reads them, and topic patterns (regular expressions). Each
must answer bad input with its own error, never another exception, and a bad message
must never hold up the good ones behind it.

Bounded so CI stays fast (``FUZZ``: 200 examples each; raise it locally to search
longer: 3,000 each found nothing more). A crash found here is kept as an explicit
``@example`` (and fixed), so it is checked on every run from then on.
"""

from __future__ import annotations

import msgspec
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from conveyor import errors
from conveyor.config import Config, load_text
from conveyor.engine.core import Engine
from conveyor.expr import ExpressionError, compile
from conveyor.journal import MemoryJournal
from conveyor.protocol import CommandDecoder, Rejected
from conveyor.protocol import messages as m
from conveyor.protocol.payload import JSON_BYTES_MAX, JSON_DEPTH_MAX, JSON_INTEGER_DIGITS_MAX
from tests.engine.engine_harness import START_TIME, Harness, config_xml, queue_xml

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# --- the protocol, decoded and handled by the engine ------------------------------------------

COMMANDS = sorted(m.COMMAND_NAMES)
KEYS = ["c", "cid", "t", "d", "s", "a", "f", "o", "bm", "x", "e", "fp", "sub_id", "query_id", "bs", "top_n",
        "client_name", "user_id", "q", "cn", "after", "max", "ttl", "upto", "epoch", "lo", "hi", "txn", "rows",
        "txns", "publisher", "seq", "token", "d", "k", "orderby", "sow_keys"]
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(allow_nan=True), st.binary(max_size=20),
    st.text(max_size=20), st.sampled_from(COMMANDS), st.sampled_from(["persisted", "processed,persisted", "0",
                                                                       "max_backlog=3", "Work", "WorkToDo",
                                                                       "Orders", "ByRegion", "oof,no_empties",
                                                                       "projection=[/r AS /r,SUM(/q) AS /t],grouping=[/r]",
                                                                       "/q DESC", "top_n=2,skip_n=1",
                                                                       '{"id":1,"r":"EU","q":2}']),
)
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.text(max_size=4), inner, max_size=4)),
                      max_leaves=12)


@st.composite
def command_maps(draw):
    """A map that looks like a command: a known name and known keys, values of any shape."""
    entry = {"c": draw(st.sampled_from(COMMANDS))}
    for key in draw(st.lists(st.sampled_from(KEYS), max_size=6)):
        entry[key] = draw(values)
    return entry


@st.composite
def frames(draw):
    """A frame body: mostly lists of command-like maps, sometimes anything, sometimes
    nested deeper than the decoder can follow."""
    kind = draw(st.sampled_from(["commands", "commands", "anything", "deep"]))
    if kind == "commands":
        body = msgspec.msgpack.encode(draw(st.lists(command_maps(), min_size=1, max_size=5)))
    elif kind == "anything":
        body = msgspec.msgpack.encode(draw(values))
    else:
        body = b"\x91" * draw(st.integers(500, 3000)) + b"\xc0"
    return len(body).to_bytes(4, "big") + body


# A SOW topic and views over it and over a queue (docs/sow-and-views.md) are fuzzed too.
SOW_XML = ("<Topic><Name>Orders</Name><MessageType>json</MessageType><Key>/id</Key><Expiration>1m</Expiration></Topic>"
           "<View><Name>ByRegion</Name><UnderlyingTopic>Orders</UnderlyingTopic><MessageType>json</MessageType>"
           "<Projection><Field>/r</Field><Field>SUM(/q) AS /t</Field></Projection>"
           "<Grouping><Field>/r</Field></Grouping></View>"
           "<View><Name>Waiting</Name><UnderlyingTopic>WorkToDo</UnderlyingTopic><MessageType>json</MessageType>"
           "<Projection><Field>COUNT(/n) AS /n</Field></Projection><Grouping><Field>/k</Field></Grouping></View>")
ENGINE_CONFIG = config_xml(queue_xml("WorkToDo") + queue_xml("Once", Semantics="at-most-once") + SOW_XML,
                           topics=("Work", "WorkToDo", "Orders"))


@FUZZ
@given(st.lists(frames(), min_size=1, max_size=4), st.integers(1, 64))
@example([b"\x00\x00\x03\xe9" + b"\x91" * 1000 + b"\xc0"], 7)  # issue 15 item 5: RecursionError escaped
def test_any_frame_gets_an_answer_never_an_exception(frame_list, chunk):
    """Bytes in, split anywhere, decoded, handled by a real engine: failures are
    ``Rejected`` entries and failure acks, never an exception out of the decoder or the
    engine (which the server would turn into a dropped connection and a traceback)."""
    engine = Engine(load_text(ENGINE_CONFIG), MemoryJournal())
    engine.recover(START_TIME)
    engine.connect(1)
    decoder = CommandDecoder(frame_bytes_max=1 << 16)
    data = b"".join(frame_list)
    for i in range(0, len(data), chunk):
        decoder.receive_data(data[i : i + chunk])
        for item in decoder.next_items():
            if isinstance(item, Rejected):
                assert isinstance(item.error, errors.ClientError)
                engine.reject(1, item.error, item.cid)
            else:
                assert isinstance(item, m.COMMAND_TYPES)
                engine.handle(1, [item], START_TIME)
            engine.on_durable(START_TIME)
            engine.take_output()


# --- the configuration loader -------------------------------------------------------------------

ELEMENTS = {
    "Transport": ["Name", "Type", "InetAddr", "Protocol", "MessageType", "MaxFrameSize",
                  "SlowClientDisconnectThreshold", "IdleTimeout"],
    "TransactionLog": ["JournalDirectory", "JournalSize", "FlushInterval", "FreeSpaceWarning", "PreallocatedJournalFiles"],
    "Queue": ["Name", "MessageType", "UnderlyingTopic", "Semantics", "LeasePeriod", "Expiration", "MaxBacklog",
              "MaxPerSubscriptionBacklog", "FairnessModel", "MaxCancels", "MaxDeliveries", "Priority",
              "BarrierExpression", "TargetQueueDepth", "Leasing", "RecoveryPoint", "FileBackedMetadata", "Filter"],
}
TEXTS = st.one_of(
    st.sampled_from(["", "0", "-1", "1", "10", "1s", "0ms", "1.5K", "64k", "1G", "1000000000T", "9007", "0.0.0.0:0",
                     "[::1]:9007", "host:99999", "json", "at-most-once", "round-robin", "fast", "strict", "sloppy",
                     "enabled", "maybe", "/a > 1", "/a LIKE '(a|b)*c'", "((", "Work", "WorkToDo", ".*", "[",
                     "${HOME}", "${NOPE}", "1h30m", "5 parsecs", "NOW", "EPOCH", "tcps", "amps"]),
    st.text(alphabet="<>&;/$:{}[]()0123456789 .-_aZ'\"", max_size=16),
)


@st.composite
def element(draw, tag: str) -> str:
    children = draw(st.lists(st.sampled_from(ELEMENTS[tag]), max_size=7))
    inner = "".join(f"<{c}>{_escape(draw(TEXTS))}</{c}>" for c in children)
    return f"<{tag}>{inner}</{tag}>"


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


@st.composite
def configs(draw) -> str:
    transports = "".join(draw(st.lists(element("Transport"), max_size=2)))
    tlog = draw(st.one_of(st.just(""), element("TransactionLog")))
    queues = "".join(draw(st.lists(element("Queue"), max_size=3)))
    return f"<AMPSConfig><Transports>{transports}</Transports>{tlog}<SOW>{queues}</SOW></AMPSConfig>"


@FUZZ
@given(configs())
@example("<AMPSConfig><Transports></Transports><TransactionLog><JournalDirectory>j</JournalDirectory>"
         "<JournalSize>100T</JournalSize></TransactionLog><SOW></SOW></AMPSConfig>")  # issue 32 item 4
def test_any_configuration_loads_or_is_refused_with_a_config_error(text):
    """And a configuration that loads builds a journal of its segment size and an engine,
    or is refused (ConfigError) by it: a filter, a Priority or a BarrierExpression that
    does not compile. A value the journal cannot take must be refused by the loader."""
    try:
        config = load_text(text, env={"HOME": "/home/x"})
    except errors.ConfigError as exc:
        assert str(exc)
        return
    assert isinstance(config, Config)
    tlog = config.transaction_log
    journal = MemoryJournal() if tlog is None else MemoryJournal(segment_bytes=tlog.segment_bytes)
    try:
        Engine(config, journal)
    except errors.ConfigError as exc:
        assert str(exc)


# --- the expression compiler ----------------------------------------------------------------------

ATOMS = ["/a", "/b/c", "/a[0]", "/arr", "1", "-1", "0.5", "1e308", "9223372036854775808", "'x'", "'(a|b)*c'", "NULL",
         "TRUE", "FALSE", "UNIX_TIMESTAMP()", "TOPIC_NAME()", "UPPER(/a)", "LENGTH(/b/c)", "COALESCE(/a, 1)"]
BINARY = ["+", "-", "*", "/", "%", "=", "<>", "<", ">=", "AND", "OR", "LIKE", "NOT LIKE", "IN", "BETWEEN"]


@st.composite
def expressions(draw, depth: int = 0) -> str:
    if depth > 5 or draw(st.booleans()):
        return draw(st.sampled_from(ATOMS))
    shape = draw(st.sampled_from(["binary", "not", "paren", "in", "between", "call", "deep"]))
    left, right = draw(expressions(depth + 1)), draw(expressions(depth + 1))
    if shape == "binary":
        op = draw(st.sampled_from(BINARY))
        if op == "IN":
            return f"{left} IN ({right}, {draw(expressions(depth + 1))})"
        if op == "BETWEEN":
            return f"{left} BETWEEN {right} AND {draw(expressions(depth + 1))}"
        return f"{left} {op} {right}"
    if shape == "not":
        return f"NOT {left}"
    if shape == "paren":
        return f"({left})"
    if shape == "call":
        return f"{draw(st.sampled_from(['UPPER', 'LOWER', 'LENGTH', 'ABS', 'ROUND', 'COALESCE', 'NOPE']))}({left})"
    n = draw(st.integers(10, 200))
    return "(" * n + left + ")" * n


messages = st.dictionaries(st.sampled_from(["a", "b", "arr"]),
                           st.one_of(st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=8), st.none(),
                                     st.lists(st.integers(), max_size=3), st.dictionaries(st.just("c"), st.integers())),
                           max_size=3)


@FUZZ
@given(expressions(), messages)
def test_any_expression_compiles_or_is_refused_and_evaluates_without_crashing(text, message):
    try:
        expr = compile(text)
    except ExpressionError as exc:
        assert str(exc)
        return
    meta = {"topic": "t", "bookmark": "1|1|0", "sequence": 1, "timestamp": START_TIME, "correlation_id": None,
            "length": 10, "now": START_TIME}
    assert expr.matches(message, meta) in (True, False)



# --- JSON bodies, through every stage that reads them ---------------------------------------------

json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False, allow_infinity=False),
              st.text(max_size=8)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(["id", "r", "q", "a", "[{"]),
                                                                         inner, max_size=3)),
    max_leaves=10)


def _nested(kinds: list[str], leaf: bytes) -> bytes:
    """``leaf`` inside arrays ("[") and objects ("{"), outermost first."""
    opened = b"".join(b"[" if k == "[" else b'{"a":' for k in kinds)
    closed = b"".join(b"]" if k == "[" else b"}" for k in reversed(kinds))
    return opened + leaf + closed


@st.composite
def bodies(draw) -> bytes:
    """A message body: JSON, or JSON the server must not parse (nested too deep, too
    large, invalid UTF-8, numbers out of any range), or not JSON at all."""
    kind = draw(st.sampled_from(["json", "deep", "deep", "near", "wide", "utf8", "number", "bytes", "mutated"]))
    if kind == "json":
        return msgspec.json.encode(draw(json_values))
    if kind in ("deep", "near"):
        depth = draw(st.integers(JSON_DEPTH_MAX + 1, 4000)) if kind == "deep" else \
            draw(st.integers(JSON_DEPTH_MAX - 3, JSON_DEPTH_MAX + 1))
        kinds = draw(st.lists(st.sampled_from("[{"), min_size=1, max_size=4))
        text = draw(st.sampled_from([b"1", b'"]]]}}}"', b'"\\"[[["', b"[]"]))
        body = _nested([kinds[i % len(kinds)] for i in range(depth)], text)
        return body[: draw(st.integers(len(body) // 2, len(body)))] if draw(st.booleans()) else body  # cut short
    if kind == "wide":
        return b"[" + b",".join([draw(st.sampled_from([b"[]", b"{}", b'"["', b"1"]))] * draw(st.integers(1, 20_000))) + b"]"
    if kind == "utf8":
        bad = draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xe2\x82"]))
        return b'{"r": "' + draw(st.binary(max_size=4)) + bad + b'", "q": 1}'
    if kind == "number":
        number = draw(st.sampled_from([b"1e400", b"-1e400", b"1e-400", b"123456789012345678901234567890",
                                       b"1" * (JSON_INTEGER_DIGITS_MAX + 1), b"1" * JSON_INTEGER_DIGITS_MAX,
                                       b"0." + b"1" * 5000, b"-" + b"9" * 400 + b".5e308"]))
        return b'{"id": 1, "q": ' + number + b', "r": "x"}'
    if kind == "bytes":
        return draw(st.binary(max_size=64))
    body = bytearray(msgspec.json.encode(draw(json_values)))
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(body)))
        body[at:at] = draw(st.sampled_from([b"[", b"{", b"]", b'"', b"\\", b"\xff", b"1e999"]))
    return bytes(body)


BODY_SOW = ("<Topic><Name>Orders</Name><MessageType>json</MessageType><Key>/id</Key></Topic>"
            "<View><Name>ByRegion</Name><UnderlyingTopic>Orders</UnderlyingTopic><MessageType>json</MessageType>"
            "<Projection><Field>/r</Field><Field>SUM(/q) AS /t</Field></Projection>"
            "<Grouping><Field>/r</Field></Grouping></View>")
BODY_CONFIG = config_xml(queue_xml("Jobs", underlying="J", Filter="/q > 0 OR /q IS NULL", Priority="/q")
                         + BODY_SOW, topics=("J", "Orders"))
MARK = b'{"id": 424242, "r": "mark", "q": 7, "a": "mark"}'  # published after the bodies: must get through


@FUZZ
@given(st.lists(bodies(), min_size=1, max_size=3))
@example([b"[" * 5000 + b"]" * 5000])  # issue 32 item 1: RecursionError in the decoder
@example([b" " * (JSON_BYTES_MAX + 1)])  # just over the size limit
def test_any_body_is_refused_or_delivered_and_never_holds_up_the_next(body_list):
    """Each body is published to a json topic (a queue with a Filter and a Priority over
    it), to a topic that is not json, to a SOW topic (whole and as a delta) under a view,
    and as a sow_delete's data; filtered, delta, view and queue subscribers listen. Every
    command is answered (a refusal is bad_message naming why), nothing raises, and a good
    message published after them reaches every subscriber."""
    h = Harness(BODY_CONFIG)
    subs = {name: h.connect(name) for name in ("json", "live", "delta", "view", "worker")}
    h.subscribe(subs["json"], "J", filter="/q > 0 AND /a LIKE 'ma(r|x)k'")
    h.subscribe(subs["live"], "live", filter="/q > 0")
    h.handle(subs["delta"], m.DeltaSubscribe(topic="Orders", sub_id="s", filter="/q > 0"))
    h.handle(subs["view"], m.Subscribe(topic="ByRegion", sub_id="s"))
    h.subscribe(subs["worker"], "Jobs", options="max_backlog=1000")
    pub = h.connect("pub")
    sent = 0
    for data in body_list:
        commands = [m.Publish(topic="J", data=data, cid=None, ack_type="processed"),
                    m.Publish(topic="live", data=data, ack_type="processed"),
                    m.Publish(topic="Orders", data=data, ack_type="processed"),
                    m.DeltaPublish(topic="Orders", data=data, ack_type="processed"),
                    m.SowDelete(topic="Orders", data=data, cid="d", ack_type="processed")]
        h.handle(pub, *commands)
        sent += len(commands)
        h.commit()
    for acked in h.acks(pub):
        assert acked.status in ("success", "failure")
        if acked.status == "failure":
            assert acked.code in ("bad_message", "invalid_option"), acked
            assert acked.reason and "\n" not in acked.reason
        sent -= 1
    assert sent == 0, "a command went unanswered"
    h.handle(pub, m.Publish(topic="J", data=MARK), m.Publish(topic="live", data=MARK),
             m.Publish(topic="Orders", data=MARK))
    h.commit()
    while h.engine.fanout_pending:
        h._collect()
    for name in ("json", "live", "delta", "worker"):
        assert any(b"424242" in x.data or b"mark" in x.data for x in h.messages(subs[name])), name
    assert any(b"mark" in x.data for x in h.messages(subs["view"]))


# --- topic patterns --------------------------------------------------------------------------------

patterns = st.one_of(
    st.text(alphabet="()[]{}|*+?^$\\.-:,<>=!#PWork0123456789", max_size=16),
    st.sampled_from(["orders.(eu", "(" * 3000, "a{99999999999}", "[z-a]", "(?P<n>x)(?P=n", "(?<=a+)b", "\\",
                     "x{2,1}", "(?i", "^Work$", "W.*", "(Work|Jobs)", "(?P<x>W)(?P=x)", "[\\d-z]", "a**"]),
)


@FUZZ
@given(st.lists(patterns, min_size=1, max_size=4))
@example(["orders.(eu"])  # issue 32 item 3: re.error escaped and dropped the connection
def test_any_topic_pattern_is_subscribed_or_refused_with_one_line(pattern_list):
    h = Harness(config_xml(queue_xml("Jobs") + BODY_SOW, topics=("Work", "Orders")))
    conn, plain, pub = h.connect("c"), h.connect("plain"), h.connect("pub")
    h.subscribe(plain, "Work")
    for i, pattern in enumerate(pattern_list):
        for kind, command in enumerate([m.Subscribe(topic=pattern, sub_id=f"s{i}", cid=f"{i}.0"),
                                        m.Subscribe(topic=pattern, sub_id=f"r{i}", cid=f"{i}.1", bookmark="0"),
                                        m.SowAndSubscribe(topic=pattern, sub_id=f"q{i}", cid=f"{i}.2"),
                                        m.DeltaSubscribe(topic=pattern, sub_id=f"d{i}", cid=f"{i}.3")]):
            h.handle(conn, command, m.Flush(cid="after", ack_type="processed"))
            out = h.acks(conn)
            assert out and out[-1].cid == "after", "the connection stopped answering"
            for refused in (a for a in out if a.status == "failure"):
                assert refused.reason and "\n" not in refused.reason and len(refused.reason) < 400
                if refused.code == "bad_topic":
                    assert refused.details["topic"] == pattern[:80] and "regular expression" in refused.reason
            h.take(conn)
    h.publish(pub, "Work", {"n": 1})
    h.commit()
    assert len(h.messages(plain)) == 1
