"""Every accepted element maps to the model (docs/configuration.md, the element tables)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from conveyor.config import (
    FRAME_BYTES_MAX_DEFAULT,
    JOURNAL_SEGMENT_BYTES_DEFAULT,
    LEASE_PERIOD_DEFAULT_S,
    OUTPUT_BYTES_MAX_DEFAULT,
    Admin,
    Fairness,
    Leasing,
    QueueConfig,
    QueueKind,
    RecordedTopic,
    Replication,
    ReplicationDestination,
    Retention,
    Semantics,
    TransactionLog,
    Transport,
    load_file,
    load_text,
)
from conveyor.errors import ConfigError

from tests.config.config_helpers import config_xml, load_queue, loads, queue_xml, refused

FULL = """<?xml version="1.0" encoding="UTF-8"?>
<AMPSConfig>
  <Name>east-1</Name>
  <Group>east</Group>
  <Transports>
    <Transport>
      <Name>clients</Name>
      <Type>tcp</Type>
      <InetAddr>10.0.0.5:9007</InetAddr>
      <Protocol>amps</Protocol>
      <MessageType>json</MessageType>
      <MaxFrameSize>4M</MaxFrameSize>
      <SlowClientDisconnectThreshold>256MB</SlowClientDisconnectThreshold>
      <IdleTimeout>5m</IdleTimeout>
    </Transport>
    <Transport>
      <InetAddr>[::1]:9008</InetAddr>
    </Transport>
  </Transports>
  <Admin>
    <InetAddr>8085</InetAddr>
    <FileName>./stats.db</FileName>
  </Admin>
  <TransactionLog>
    <JournalDirectory>/var/lib/conveyor/journal</JournalDirectory>
    <JournalArchiveDirectory>/mnt/archive</JournalArchiveDirectory>
    <PreallocatedJournalFiles>4</PreallocatedJournalFiles>
    <MinJournalSize>256MB</MinJournalSize>
    <FlushInterval>10ms</FlushInterval>
    <Topic><Name>orders</Name><MessageType>json</MessageType></Topic>
    <Topic><Name>^work\\..*</Name></Topic>
    <Retention><MaxAge>7d</MaxAge><MaxSize>100G</MaxSize></Retention>
  </TransactionLog>
  <SOW>
    <Queue>
      <Name>orders-q</Name>
      <MessageType>json</MessageType>
      <UnderlyingTopic>orders</UnderlyingTopic>
      <DefaultPublishTarget>orders</DefaultPublishTarget>
      <Semantics>at-least-once</Semantics>
      <LeasePeriod>1h30m</LeasePeriod>
      <Expiration>2d</Expiration>
      <MaxBacklog>1000</MaxBacklog>
      <MaxPerSubscriptionBacklog>10</MaxPerSubscriptionBacklog>
      <FairnessModel>fast</FairnessModel>
      <MaxCancels>3</MaxCancels>
      <MaxDeliveries>5</MaxDeliveries>
      <TargetQueueDepth>500</TargetQueueDepth>
      <Leasing>sloppy</Leasing>
      <RecoveryPoint>epoch</RecoveryPoint>
      <FileBackedMetadata>enabled</FileBackedMetadata>
      <Filter>/region = 'EU'</Filter>
    </Queue>
    <GroupLocalQueue>
      <Topic>work.local</Topic>
      <MessageType>json</MessageType>
      <UnderlyingTopic>^work\\..*</UnderlyingTopic>
      <DefaultPublishTarget>work.local</DefaultPublishTarget>
      <InitialOwner>east-1</InitialOwner>
      <GroupLocalQueueDomain>work</GroupLocalQueueDomain>
      <Priority>/urgency</Priority>
    </GroupLocalQueue>
  </SOW>
  <Replication>
    <Destination>
      <Name>west-1</Name>
      <Group>west</Group>
      <SyncType>sync</SyncType>
      <Transport>
        <Type>amps-replication</Type>
        <InetAddr>west-1.example.com:10005</InetAddr>
        <InetAddr>west-1b.example.com:10005</InetAddr>
      </Transport>
      <Transport>
        <InetAddr>[fd00::2]:10005</InetAddr>
      </Transport>
      <Topic><Name>^(orders|work\\..*)$</Name><MessageType>json</MessageType></Topic>
      <Topic><Name>^work\\..*</Name><MessageType>json</MessageType></Topic>
      <PassThrough>^east$</PassThrough>
    </Destination>
  </Replication>
</AMPSConfig>
"""


@pytest.fixture
def full():
    return load_text(FULL, source="full.xml")


def test_instance(full):
    assert full.name == "east-1"
    assert full.group == "east"
    assert full.source == "full.xml"


def test_transports(full):
    assert full.transports == (
        Transport(
            name="clients",
            type="tcp",
            host="10.0.0.5",
            port=9007,
            protocol="conveyor",  # amps is a synonym
            message_type="json",
            frame_bytes_max=4 * 1024**2,
            output_bytes_max=256 * 1024**2,
            idle_timeout_s=300.0,
        ),
        Transport(name="transport-2", host="::1", port=9008),
    )
    default = full.transports[1]
    assert default.frame_bytes_max == FRAME_BYTES_MAX_DEFAULT
    assert default.output_bytes_max == OUTPUT_BYTES_MAX_DEFAULT
    assert default.protocol == "conveyor" and default.idle_timeout_s is None


def test_admin_on_a_bare_port_listens_on_loopback(full):
    assert full.admin == Admin(host="127.0.0.1", port=8085, file_name="./stats.db")


def test_transaction_log(full):
    assert full.transaction_log == TransactionLog(
        journal_directory=Path("/var/lib/conveyor/journal"),
        topics=(RecordedTopic("orders", "json"), RecordedTopic(r"^work\..*", "json")),
        flush_interval_s=0.01,
        segment_bytes=256 * 1024**2,
        preallocated_journal_files=4,
        archive_directory=Path("/mnt/archive"),
        retention=Retention(max_age_s=7 * 86400.0, max_bytes=100 * 1024**3),
    )


def test_every_queue_element(full):
    queue, group_local = full.queues
    assert queue == QueueConfig(
        name="orders-q",
        message_type="json",
        kind=QueueKind.QUEUE,
        underlying_topic="orders",
        default_publish_target="orders",
        semantics=Semantics.AT_LEAST_ONCE,
        lease_period_s=5400.0,
        expiration_s=2 * 86400.0,
        max_backlog=1000,
        max_per_subscription_backlog=10,
        fairness=Fairness.FAST,
        max_cancels=3,
        max_deliveries=5,
        target_queue_depth=500,
        leasing=Leasing.SLOPPY,
        recovery_point="epoch",
        file_backed_metadata=True,
        filter="/region = 'EU'",
        path="AMPSConfig/SOW/Queue[1]",
    )
    assert group_local == QueueConfig(
        name="work.local",  # <Topic> instead of <Name>
        message_type="json",
        kind=QueueKind.GROUP_LOCAL,
        underlying_topic=r"^work\..*",
        default_publish_target="work.local",
        priority="/urgency",
        initial_owner="east-1",
        group_local_queue_domain="work",
        path="AMPSConfig/SOW/GroupLocalQueue[1]",
    )


def test_replication(full):
    assert full.replication == Replication(
        destinations=(
            ReplicationDestination(
                name="west-1",
                group="west",
                sync_type="sync",
                addresses=(
                    "west-1.example.com:10005",
                    "west-1b.example.com:10005",
                    "[fd00::2]:10005",
                ),
                # the second: the underlying topic of the replicated queue work.local (rule 9)
                topics=(RecordedTopic(r"^(orders|work\..*)$", "json"), RecordedTopic(r"^work\..*", "json")),
                pass_through="^east$",
            ),
        )
    )


def test_load_file(tmp_path):
    path = tmp_path / "conveyor.xml"
    path.write_text(FULL)
    config = load_file(path)
    assert config.source == str(path)
    assert config.queues == load_text(FULL, source=str(path)).queues


def test_load_file_missing(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_file(tmp_path / "nope.xml")
    assert "cannot read configuration file" in str(info.value)
    assert "nope.xml" in str(info.value)


def test_load_file_honours_the_declared_encoding(tmp_path):
    path = tmp_path / "latin1.xml"
    path.write_bytes('<?xml version="1.0" encoding="ISO-8859-1"?>\n'
                     "<AMPSConfig><Name>caf\u00e9</Name></AMPSConfig>".encode("latin-1"))
    assert load_file(path).name == "caf\u00e9"


# --- defaults ---------------------------------------------------------------------------


def test_queue_defaults():
    queue = load_queue("")
    assert queue.kind is QueueKind.QUEUE
    assert queue.semantics is Semantics.AT_LEAST_ONCE
    assert queue.fairness is Fairness.PROPORTIONAL
    assert queue.lease_period_s == LEASE_PERIOD_DEFAULT_S == math.inf  # the reference's: no lease expiry
    assert queue.max_per_subscription_backlog == 1  # the reference's queue table (G.8)
    assert queue.leasing is Leasing.SUBLET  # the reference's queue table (G.8)
    assert queue.deferred_ack_expiration_s == 86400.0  # one day, ditto
    assert queue.file_backed_metadata is False
    for attr in ("expiration_s", "max_backlog", "max_cancels",
                 "max_deliveries", "priority", "barrier_expression", "target_queue_depth",
                 "recovery_point", "filter"):
        assert getattr(queue, attr) is None, attr
    # The reference's default (G.8): a literal UnderlyingTopic, so a publish to the
    # queue's name enters the queue.
    assert queue.default_publish_target == "Work"


def test_a_regex_underlying_topic_takes_the_default_publish_target_given():
    xml = config_xml("<SOW><Queue><Name>Q</Name><MessageType>json</MessageType>"
                     "<UnderlyingTopic>^Work$|^Other$</UnderlyingTopic>"
                     "<DefaultPublishTarget>Other</DefaultPublishTarget></Queue></SOW>", topics=("Work", "Other"))
    (queue,) = loads(xml).queues
    assert queue.default_publish_target == "Other"


def test_at_most_once_defaults_to_round_robin():
    assert load_queue("<Semantics>at-most-once</Semantics>").fairness is Fairness.ROUND_ROBIN
    explicit = "<Semantics>at-most-once</Semantics><FairnessModel>round-robin</FairnessModel>"
    assert load_queue(explicit).fairness is Fairness.ROUND_ROBIN


def test_transaction_log_defaults():
    log = loads(config_xml()).transaction_log
    assert log.segment_bytes == JOURNAL_SEGMENT_BYTES_DEFAULT
    assert log.flush_interval_s == 0.0
    assert log.preallocated_journal_files == 2
    assert log.archive_directory is None
    assert log.retention == Retention()


def test_recorded_topic_message_type_defaults_to_json():
    xml = ("<AMPSConfig><TransactionLog><JournalDirectory>d</JournalDirectory>"
           "<Topic><Name>Work</Name></Topic></TransactionLog></AMPSConfig>")
    assert loads(xml).transaction_log.topics == (RecordedTopic("Work", "json"),)


def test_empty_config():
    config = loads("<AMPSConfig/>")
    assert config.name == "conveyor"
    assert config.transports == () and config.queues == () and config.actions == ()
    assert config.transaction_log is None and config.admin is None
    assert config.replication is None


# --- leniency ---------------------------------------------------------------------------


@pytest.mark.parametrize("tag, kind", [("QueueDefinition", QueueKind.QUEUE),
                                       ("LocalQueue", QueueKind.LOCAL)])
def test_queue_tags(tag, kind):
    queue = load_queue("", tag=tag)
    assert queue.kind is kind
    assert queue.path == f"AMPSConfig/SOW/{tag}[1]"


def test_queue_order_is_document_order_across_tags():
    sow = ("<SOW><LocalQueue><Name>A</Name><MessageType>json</MessageType></LocalQueue>"
           "<Queue><Name>B</Name><MessageType>json</MessageType></Queue>"
           "<LocalQueue><Name>C</Name><MessageType>json</MessageType></LocalQueue></SOW>")
    config = loads(config_xml(sow, topics=("A", "B", "C")))
    assert [(q.name, q.path) for q in config.queues] == [
        ("A", "AMPSConfig/SOW/LocalQueue[1]"),
        ("B", "AMPSConfig/SOW/Queue[1]"),
        ("C", "AMPSConfig/SOW/LocalQueue[2]"),
    ]


def test_surrounding_whitespace_is_ignored():
    queue = load_queue("<LeasePeriod>\n   45s\n  </LeasePeriod><Semantics>  at-most-once "
                       "</Semantics>")
    assert queue.lease_period_s == 45.0
    assert queue.semantics is Semantics.AT_MOST_ONCE


@pytest.mark.parametrize("value, expected", [("enabled", True), ("disabled", False),
                                             ("true", True), ("FALSE", False),
                                             ("Enabled", True)])
def test_file_backed_metadata_values(value, expected):
    assert load_queue(f"<FileBackedMetadata>{value}</FileBackedMetadata>") \
        .file_backed_metadata is expected


@pytest.mark.parametrize("value", ["AT-LEAST-ONCE", "At-Most-Once"])
def test_enum_values_ignore_case(value):
    assert load_queue(f"<Semantics>{value}</Semantics><FairnessModel>Round-Robin"
                      "</FairnessModel>").fairness is Fairness.ROUND_ROBIN


def test_transport_type_amps_means_tcp():
    xml = config_xml("<Transports><Transport><Type>amps</Type><InetAddr>localhost:0</InetAddr>"
                     "</Transport><Transport><InetAddr>localhost:0</InetAddr></Transport>"
                     "</Transports>")
    first, second = loads(xml).transports
    assert first.type == "tcp" and first.host == "localhost" and first.port == 0
    assert second.port == 0  # port 0 (any free port) may repeat


def test_comments_and_cdata():
    xml = config_xml(
        "<!-- dead letters --><SOW><Queue><Name>Jobs</Name><!-- n --><MessageType>json"
        "</MessageType></Queue></SOW><Actions><Action><On><Module>"
        "amps-action-on-sow-expire-message</Module><Options><Topic>Jobs</Topic>"
        "<MessageType>json</MessageType></Options></On><Do><Module>"
        "amps-action-do-publish-message</Module><Options><Topic>Dead</Topic>"
        "<MessageType>json</MessageType><Data><![CDATA[{\"m\": {{AMPS_DATA}}, \"x\": 1 < 2}]]>"
        "</Data><Delta>true</Delta><UpdateOnly>TRUE</UpdateOnly></Options></Do></Action>"
        "</Actions>", topics=("Jobs", "Dead"))
    (action,) = loads(xml).actions
    assert action.do[0].data == '{"m": {{AMPS_DATA}}, "x": 1 < 2}'
    assert action.do[0].delta and action.do[0].update_only


def test_default_publish_target_equal_to_a_literal_underlying_topic():
    queue = load_queue("<DefaultPublishTarget>Work</DefaultPublishTarget>")
    assert queue.default_publish_target == "Work"



def test_zero_means_no_maximum_and_sublet_is_the_reference_name():
    from conveyor.config import load_text
    from conveyor.config.model import Leasing

    config = load_text("""<AMPSConfig><TransactionLog><JournalDirectory>j</JournalDirectory>
        <Topic><Name>q</Name></Topic></TransactionLog><SOW><Queue><Name>q</Name><MessageType>json</MessageType>
        <MaxCancels>0</MaxCancels><MaxDeliveries>0</MaxDeliveries><Leasing>sublet</Leasing></Queue></SOW></AMPSConfig>""")
    (q,) = config.queues
    assert q.max_cancels is None and q.max_deliveries is None and q.leasing is Leasing.SUBLET
    assert Leasing.SLOPPY is Leasing.SUBLET


@pytest.mark.parametrize("point", ["epoch", "now", "NOW", "creation", "0", "1|2|30", "20261123T120000Z",
                                   "20261123T120000.5"])
def test_recovery_point_values_of_the_reference_are_accepted(point):
    assert load_queue(f"<RecoveryPoint>{point}</RecoveryPoint>").recovery_point == point


def test_a_recovery_point_that_is_no_bookmark_or_timestamp_is_refused_at_load():
    refused(config_xml(queue_xml("<RecoveryPoint>LastThursday</RecoveryPoint>")),
            "AMPSConfig/SOW/Queue[1]/RecoveryPoint", "RecoveryPoint 'LastThursday'", hint="epoch, now, creation, a bookmark")


def test_deferred_ack_expiration_is_a_duration():
    assert load_queue("<DeferredAckExpiration>2h</DeferredAckExpiration>").deferred_ack_expiration_s == 7200.0
    refused(config_xml(queue_xml("<DeferredAckExpiration>0</DeferredAckExpiration>")),
            "AMPSConfig/SOW/Queue[1]/DeferredAckExpiration", "longer than zero")
