"""Hypothesis fuzzing of the three parsers that take input from outside: the protocol
decoder (all the way into the engine), the configuration loader and the expression
compiler. Each must answer bad input with its own error, never another exception.

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
from tests.engine.engine_harness import START_TIME, config_xml, queue_xml

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
def test_any_configuration_loads_or_is_refused_with_a_config_error(text):
    """And a configuration that loads builds an engine, or is refused (ConfigError) by
    it: a filter, a Priority or a BarrierExpression that does not compile."""
    try:
        config = load_text(text, env={"HOME": "/home/x"})
    except errors.ConfigError as exc:
        assert str(exc)
        return
    assert isinstance(config, Config)
    try:
        Engine(config, MemoryJournal())
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
