"""One test per validation rule (docs/configuration.md, "Validation"): each asserts the
element path, the message and the hint."""

from __future__ import annotations

import pytest

from tests.config.config_helpers import config_xml, loads, queue_xml, recorded, refused

Q1 = "AMPSConfig/SOW/Queue[1]"

# --- XML and structure --------------------------------------------------------------


def test_malformed_xml_reports_line_and_column():
    err = refused(
        "<AMPSConfig>\n  <Name>x</Nme>\n</AMPSConfig>", "", "mismatched tag",
        "line 2, column 12", hint="mismatched",
    )
    assert "<text>" in str(err)  # the source


def test_root_must_be_amps_config():
    refused("<SOW/>", "SOW", "the root element is <SOW>, expected <AMPSConfig>",
            hint="wrap the configuration in <AMPSConfig>")


def test_unknown_element_suggests_the_nearest_name():
    refused(config_xml(queue_xml("<LeasPeriod>1s</LeasPeriod>")), f"{Q1}/LeasPeriod",
            "unknown element <LeasPeriod> in <Queue>", "line 3",
            hint="did you mean <LeasePeriod>?")


def test_unknown_element_at_the_root():
    refused(config_xml("<Transport/>"), "AMPSConfig/Transport",
            "unknown element <Transport> in <AMPSConfig>", hint="<Transports>")


def test_unknown_element_without_a_near_name_lists_the_known_ones():
    err = refused(config_xml("<Zzz/>"), "AMPSConfig/Zzz", "unknown element <Zzz>",
                  hint="known elements here:")
    assert "<TransactionLog>" in err.hint and "<SOW>" in err.hint


def test_element_names_are_case_sensitive():
    refused(config_xml(queue_xml("<semantics>at-most-once</semantics>")),
            f"{Q1}/semantics", "unknown element <semantics>",
            hint="case-sensitive: did you mean <Semantics>?")


def test_unsupported_amps_element_is_named():
    refused(config_xml("<MessageTypes/>"), "AMPSConfig/MessageTypes",
            "<MessageTypes> is not supported in <AMPSConfig>", hint="AMPS setting that conveyor does not implement")


def test_sow_topic_must_be_recorded():
    """docs/sow-and-views.md: a SOW topic's records are a fold over the transaction log."""
    refused(config_xml("<SOW><Topic><Name>Orders</Name><MessageType>json</MessageType>"
                       "<Key>/id</Key></Topic></SOW>"),
            "AMPSConfig/SOW/Topic[1]", "a SOW topic (its records are kept in the transaction log), 'Orders', "
            "is not recorded", hint="<Topic><Name>Orders</Name>")


def test_conflated_topic_needs_its_underlying_topic():
    """tests/config/test_conflated_topic_config.py has the rest of its rules."""
    refused(config_xml("<SOW><ConflatedTopic><Name>C</Name></ConflatedTopic></SOW>"),
            "AMPSConfig/SOW/ConflatedTopic[1]", "missing the required element <UnderlyingTopic>")


def test_duplicate_singleton():
    refused(config_xml(queue_xml("<LeasePeriod>1s</LeasePeriod><LeasePeriod>2s</LeasePeriod>")),
            f"{Q1}/LeasePeriod[2]", "<LeasePeriod> appears more than once in <Queue>",
            hint="give <LeasePeriod> once")


def test_duplicate_section():
    xml = config_xml() .replace("</AMPSConfig>", "<TransactionLog><JournalDirectory>x"
                                "</JournalDirectory></TransactionLog></AMPSConfig>")
    refused(xml, "AMPSConfig/TransactionLog[2]", "appears more than once", hint="once")


def test_queue_name_is_required():
    refused(config_xml("<SOW><Queue><MessageType>json</MessageType></Queue></SOW>"), Q1,
            "<Queue> is missing the required element <Name>", hint="add <Name>")


def test_queue_message_type_is_required():
    refused(config_xml("<SOW><Queue><Name>Work</Name></Queue></SOW>"), Q1,
            "missing the required element <MessageType>", hint="add <MessageType>")


def test_journal_directory_is_required():
    refused("<AMPSConfig><TransactionLog>" + recorded("Work") + "</TransactionLog></AMPSConfig>",
            "AMPSConfig/TransactionLog", "missing the required element <JournalDirectory>",
            hint="add <JournalDirectory>")


def test_attributes_are_refused():
    refused('<AMPSConfig><Name lang="en">x</Name></AMPSConfig>', "",
            "<Name> has an attribute 'lang'", "line 1", hint="take no attributes")


def test_doctype_is_refused():
    refused('<!DOCTYPE x [<!ENTITY a "b">]><AMPSConfig/>', "", "DOCTYPE",
            hint="remove the <!DOCTYPE")


def test_text_in_a_container_is_refused():
    refused(config_xml("<SOW>Work</SOW>"), "AMPSConfig/SOW", "holds elements, not text",
            hint="child elements")


def test_elements_in_a_value_are_refused():
    refused(config_xml(queue_xml("<Priority><Expr>/a</Expr></Priority>")), f"{Q1}/Priority",
            "takes a value, not elements", hint="<Priority>value</Priority>")


def test_empty_value_is_refused():
    refused(config_xml(queue_xml("<LeasePeriod>  </LeasePeriod>")), f"{Q1}/LeasePeriod",
            "<LeasePeriod> is empty", hint="give <LeasePeriod> a value")


# --- values -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "tag, value, choices",
    [
        ("Semantics", "exactly-once", "at-least-once, at-most-once"),
        ("FairnessModel", "random", "fast, round-robin, proportional"),
        ("Leasing", "lax", "strict, sublet, sloppy"),
        ("FileBackedMetadata", "on", "enabled, disabled, true, false"),
    ],
)
def test_bad_enum_value(tag, value, choices):
    refused(config_xml(queue_xml(f"<{tag}>{value}</{tag}>")), f"{Q1}/{tag}",
            f"{value!r} is not a valid <{tag}>", hint=f"use one of: {choices}")


@pytest.mark.parametrize(
    "tag", ["MaxCancels", "MaxDeliveries", "MaxPerSubscriptionBacklog", "TargetQueueDepth",
            "MaxBacklog"],
)
@pytest.mark.parametrize("value", ["0", "-3", "ten", "1.5", "10K", "+4"])
def test_counts_must_be_positive_integers(tag, value):
    if value == "0" and tag in ("MaxCancels", "MaxDeliveries"):
        pytest.skip("0 means no maximum for MaxCancels and MaxDeliveries (test_config_elements)")
    err = refused(config_xml(queue_xml(f"<{tag}>{value}</{tag}>")), f"{Q1}/{tag}", f"<{tag}>")
    assert "positive integer" in str(err) and "positive integer" in err.hint


def test_counts_must_fit_in_64_bits():
    refused(config_xml(queue_xml(f"<MaxBacklog>{2**63}</MaxBacklog>")), f"{Q1}/MaxBacklog",
            "is too large", hint="fits in 64 bits")


def test_bad_duration_names_the_element():
    refused(config_xml(queue_xml("<LeasePeriod>LastThursday</LeasePeriod>")),
            f"{Q1}/LeasePeriod", "'LastThursday' is not a duration", "line 3",
            hint="units: ns, us, ms, s, m (minutes), h, d, w")


@pytest.mark.parametrize("tag", ["LeasePeriod", "Expiration"])
def test_zero_duration_is_refused_where_it_must_be_positive(tag):
    refused(config_xml(queue_xml(f"<{tag}>0s</{tag}>")), f"{Q1}/{tag}",
            "must be longer than zero", hint="positive duration")


def test_bad_size_names_the_element():
    xml = config_xml(txlog_extra="<JournalSize>10 parsecs</JournalSize>")
    refused(xml, "AMPSConfig/TransactionLog/JournalSize", "unknown unit 'parsecs'",
            hint="binary: 1K = 1024 bytes")


# --- queues and the transaction log -------------------------------------------------


def test_queues_need_a_transaction_log():
    refused(config_xml(queue_xml(""), txlog=False), Q1,
            "queue 'Q' needs a <TransactionLog>", hint="a <Topic> recording 'Work'")


def test_literal_underlying_topic_must_be_recorded():
    refused(config_xml(queue_xml(""), topics=("Other",)), f"{Q1}/UnderlyingTopic",
            "the underlying topic of queue 'Q', 'Work', is not recorded",
            hint="<Topic><Name>Work</Name><MessageType>json</MessageType></Topic>")


def test_queue_name_is_the_underlying_topic_when_none_is_given():
    xml = config_xml("<SOW><Queue><Name>Jobs</Name><MessageType>json</MessageType></Queue></SOW>")
    refused(xml, Q1, "the underlying topic of queue 'Jobs', 'Jobs', is not recorded",
            hint="<Name>Jobs</Name>")


def test_underlying_topic_recorded_by_a_regex_is_enough():
    config = loads(config_xml(queue_xml(""), topics=("^Wo.*",)))
    assert config.queues[0].underlying == "Work"


def test_underlying_topic_must_be_recorded_with_the_queue_message_type():
    xml = config_xml(queue_xml("")).replace(
        "<MessageType>json</MessageType></Topic>", "<MessageType>xml</MessageType></Topic>")
    refused(xml, f"{Q1}/UnderlyingTopic", "is recorded as xml, not 'json'",
            hint="<MessageType>json</MessageType>")


def _regex_queue(target: str, topics: tuple[str, ...]) -> str:
    return config_xml(
        "<SOW><Queue><Name>ORDERS_RISK</Name><MessageType>json</MessageType>"
        "<UnderlyingTopic>^ORDERS$|^ORDERS_RISK_DIRECT$</UnderlyingTopic>"
        f"<DefaultPublishTarget>{target}</DefaultPublishTarget></Queue></SOW>",
        topics=topics,
    )


def test_default_publish_target_must_be_recorded():
    refused(_regex_queue("ORDERS_RISK_DIRECT", ("ORDERS",)), f"{Q1}/DefaultPublishTarget",
            "the DefaultPublishTarget of queue 'ORDERS_RISK', 'ORDERS_RISK_DIRECT', is not "
            "recorded", hint="<Name>ORDERS_RISK_DIRECT</Name>")


def test_default_publish_target_must_match_the_underlying_topic():
    refused(_regex_queue("ORDERS_RISKY", ("ORDERS", "ORDERS_RISKY")),
            f"{Q1}/DefaultPublishTarget",
            "'ORDERS_RISKY' does not match the UnderlyingTopic", hint="choose a target")


def test_regex_underlying_topic_needs_a_default_publish_target():
    """The reference's queue table (G.8): "required when UnderlyingTopic has regex
    characters"; with one, the queue takes every matching topic."""
    xml = config_xml(
        "<SOW><Queue><Name>ALL</Name><MessageType>json</MessageType>"
        "<UnderlyingTopic>^ORDERS_.*</UnderlyingTopic></Queue></SOW>", topics=("ORDERS_EU",))
    refused(xml, f"{Q1}/UnderlyingTopic", "regex characters ('^ORDERS_.*') needs a DefaultPublishTarget",
            hint="add <DefaultPublishTarget>")
    xml = xml.replace("</UnderlyingTopic>", "</UnderlyingTopic><DefaultPublishTarget>ORDERS_EU</DefaultPublishTarget>")
    assert loads(xml).queues[0].takes_from("ORDERS_EU")


def test_at_most_once_only_supports_round_robin():
    refused(config_xml(queue_xml("<Semantics>at-most-once</Semantics>"
                                 "<FairnessModel>proportional</FairnessModel>")),
            f"{Q1}/FairnessModel", "'proportional' is not available for an at-most-once queue",
            hint="support only round-robin")


@pytest.mark.parametrize("other", ["<Priority>/p</Priority>",
                                   "<BarrierExpression>/eod = 1</BarrierExpression>"])
def test_target_queue_depth_excludes_priority_and_barriers(other):
    tag = other[1:other.index(">")]
    refused(config_xml(queue_xml(f"<TargetQueueDepth>100</TargetQueueDepth>{other}")),
            f"{Q1}/TargetQueueDepth", f"cannot be combined with <{tag}>",
            hint=f"remove <TargetQueueDepth> or <{tag}>")


def test_group_local_queue_requires_initial_owner():
    refused(config_xml(queue_xml("", tag="GroupLocalQueue")), "AMPSConfig/SOW/GroupLocalQueue[1]",
            "<GroupLocalQueue> is missing the required element <InitialOwner>",
            hint="add <InitialOwner>")


@pytest.mark.parametrize("tag", ["Queue", "LocalQueue", "QueueDefinition"])
@pytest.mark.parametrize("element", ["InitialOwner", "GroupLocalQueueDomain"])
def test_group_local_elements_only_on_group_local_queue(tag, element):
    refused(config_xml(queue_xml(f"<{element}>east</{element}>", tag=tag)),
            f"AMPSConfig/SOW/{tag}[1]/{element}",
            f"<{element}> is only allowed on a <GroupLocalQueue>, not on <{tag}>",
            hint="declare the queue with <GroupLocalQueue>")


def test_duplicate_queue_names_across_tags():
    sow = ("<SOW><Queue><Name>Work</Name><MessageType>json</MessageType></Queue>"
           "<LocalQueue><Name>Work</Name><MessageType>json</MessageType></LocalQueue></SOW>")
    refused(config_xml(sow), "AMPSConfig/SOW/LocalQueue[1]",
            f"queue 'Work' is already declared at {Q1}", hint="its own name")


def test_name_and_topic_together_are_refused():
    sow = ("<SOW><Queue><Name>Work</Name><Topic>Work</Topic>"
           "<MessageType>json</MessageType></Queue></SOW>")
    refused(config_xml(sow), f"{Q1}/Topic", "has both <Name> and <Topic>", hint="keep one")


def test_queue_name_must_be_literal():
    sow = "<SOW><Queue><Name>Work.*</Name><MessageType>json</MessageType></Queue></SOW>"
    refused(config_xml(sow), f"{Q1}/Name", "must be a topic name, not a regular expression",
            hint="literal name")


def test_underlying_topic_regex_must_compile():
    refused(config_xml(queue_xml("").replace("<UnderlyingTopic>Work", "<UnderlyingTopic>^(Work")),
            f"{Q1}/UnderlyingTopic", "is not a valid regular expression",
            hint="Python regular-expression syntax")


# --- actions ------------------------------------------------------------------------

A1 = "AMPSConfig/Actions/Action[1]"


def _action(on_topic="Jobs", do_topic="FailedJobs", *, on_module="amps-action-on-sow-expire-message",
            do_module="amps-action-do-publish-message", on_extra="", do_extra="",
            on_type="json", extra_steps="") -> str:
    return (
        "<Actions><Action>"
        f"<On><Module>{on_module}</Module><Options><Topic>{on_topic}</Topic>"
        f"<MessageType>{on_type}</MessageType>{on_extra}</Options></On>"
        f"<Do><Module>{do_module}</Module><Options><Topic>{do_topic}</Topic>"
        f"<MessageType>json</MessageType><Data>{{{{AMPS_DATA}}}}</Data>{do_extra}</Options></Do>"
        f"{extra_steps}</Action></Actions>"
    )


_JOBS = "<SOW><Queue><Name>Jobs</Name><MessageType>json</MessageType></Queue></SOW>"


def _jobs(actions: str, topics=("Jobs", "FailedJobs"), txlog=True) -> str:
    return config_xml(_JOBS + actions, topics=topics, txlog=txlog)


def test_action_loads():
    (action,) = loads(_jobs(_action(on_extra="<Reason>max_cancels, time_limit</Reason>"))).actions
    assert action.on.reasons == frozenset({"max_cancels", "time_limit"})


def test_action_on_topic_must_be_a_queue_or_recorded():
    refused(_jobs(_action(on_topic="Nobs")), f"{A1}/On/Options/Topic",
            "watches 'Nobs', which is neither a queue nor a recorded topic",
            hint="queues: Jobs")


def test_action_on_a_recorded_topic_is_accepted():
    config = loads(_jobs(_action(on_topic="Audit"), topics=("Jobs", "FailedJobs", "Audit")))
    assert config.actions[0].on.topic == "Audit"


def test_action_on_message_type_must_match_the_queue():
    refused(_jobs(_action(on_type="xml")), f"{A1}/On/Options/MessageType",
            "queue's MessageType is 'json'", hint="<MessageType>json</MessageType>")


def test_action_publish_topic_must_be_recorded():
    refused(_jobs(_action(), topics=("Jobs",)), f"{A1}/Do[1]/Options/Topic",
            "the topic an action publishes to, 'FailedJobs', is not recorded",
            hint="<Name>FailedJobs</Name>")


def test_every_do_is_checked():
    second = ("<Do><Module>amps-action-do-publish-message</Module><Options><Topic>Audit</Topic>"
              "<MessageType>json</MessageType><Data>x</Data></Options></Do>")
    refused(_jobs(_action(extra_steps=second)), f"{A1}/Do[2]/Options/Topic",
            "'Audit', is not recorded", hint="<Name>Audit</Name>")


def test_actions_need_a_transaction_log():
    refused(config_xml(_action(), txlog=False), f"{A1}/Do[1]/Options/Topic",
            "needs a <TransactionLog>", hint="recording 'FailedJobs'")


def test_unknown_on_module():
    refused(_jobs(_action(on_module="amps-action-on-schedule")), f"{A1}/On/Module",
            "unknown <On> module 'amps-action-on-schedule'",
            hint="amps-action-on-sow-expire-message with amps-action-do-publish-message; "
                 "amps-action-on-publish-message with amps-action-do-enable-proxied-transfer")


def test_a_do_module_that_does_not_go_with_its_on_module():
    """Proxied transfer is switched by a publish, not by an expiry."""
    refused(_jobs(_action(do_module="amps-action-do-enable-proxied-transfer")),
            f"{A1}/Do[1]/Module", "unknown <Do> module", hint="amps-action-do-publish-message")


def test_action_needs_a_do():
    xml = _jobs(_action()).replace(
        xml_do := _action()[_action().index("<Do>"):_action().index("</Do>") + 5], "")
    assert xml_do.startswith("<Do>")
    refused(xml, A1, "<Action> is missing the required element <Do>", hint="add <Do>")


def test_action_takes_one_on():
    on = _action()[_action().index("<On>"):_action().index("</On>") + 5]
    refused(_jobs(_action(extra_steps=on)), f"{A1}/On[2]", "<On> appears more than once",
            hint="give <On> once")


def test_unknown_expiry_reason():
    refused(_jobs(_action(on_extra="<Reason>time_limit,bored</Reason>")),
            f"{A1}/On/Options/Reason", "unknown expiry reason 'bored'",
            hint="forced_expire, max_cancels, max_deliveries, time_limit")


def test_on_topic_cannot_be_a_regex():
    refused(_jobs(_action(on_topic="Jobs.*")), f"{A1}/On/Options/Topic",
            "not a regular expression", hint="literal name")


def test_update_only_needs_delta():
    refused(_jobs(_action(do_extra="<UpdateOnly>true</UpdateOnly>")),
            f"{A1}/Do[1]/Options/UpdateOnly", "applies only to a delta publish",
            hint="<Delta>true</Delta>")


def test_unknown_action_option():
    refused(_jobs(_action(do_extra="<Topics>x</Topics>")), f"{A1}/Do[1]/Options/Topics",
            "unknown element <Topics> in <Options>", hint="did you mean <Topic>?")


# --- transports, transaction log, replication -------------------------------------------

T1 = "AMPSConfig/Transports/Transport[1]"


def _transports(*inner: str) -> str:
    return config_xml("<Transports>" + "".join(f"<Transport>{i}</Transport>" for i in inner)
                      + "</Transports>")


@pytest.mark.parametrize("addr", ["host", "::1:9007", "host:", "host:70000", "a:b:9007",
                                  "[::1]", "9007x"])
def test_bad_inet_addr(addr):
    refused(_transports(f"<InetAddr>{addr}</InetAddr>"), f"{T1}/InetAddr", "",
            hint="PORT, HOST:PORT or [IPV6]:PORT")


def test_transport_inet_addr_is_required():
    refused(_transports("<Name>t</Name>"), T1, "missing the required element <InetAddr>",
            hint="add <InetAddr>")


def test_duplicate_transport_names():
    refused(_transports("<Name>t</Name><InetAddr>1</InetAddr>",
                        "<Name>t</Name><InetAddr>2</InetAddr>"),
            "AMPSConfig/Transports/Transport[2]", f"'t' is already used by {T1}",
            hint="its own <Name>")


def test_two_listeners_on_one_port():
    xml = config_xml("<Transports><Transport><InetAddr>9007</InetAddr></Transport></Transports>"
                     "<Admin><InetAddr>127.0.0.1:9007</InetAddr></Admin>")
    refused(xml, "AMPSConfig/Admin/InetAddr", f"127.0.0.1:9007 is already used by {T1}/InetAddr",
            hint="its own port")


@pytest.mark.parametrize("kind", ["amps-replication-secure", "tcps"])
def test_tls_transports_need_a_certificate_and_key(kind):
    refused(_transports(f"<Type>{kind}</Type><InetAddr>9007</InetAddr>"), T1,
            "a TLS listener needs <Certificate> and <PrivateKey>", hint="PEM files")


def test_tls_elements_on_a_plain_transport_are_refused(tmp_path):
    pem = tmp_path / "cert.pem"
    pem.write_text("x")
    refused(_transports(f"<Type>tcp</Type><InetAddr>9007</InetAddr><Certificate>{pem}</Certificate>"),
            f"{T1}/Certificate", "<Certificate> needs TLS", hint="tcps")


def test_one_incoming_replication_transport():
    cfg = loads(_transports("<Type>amps-replication</Type><InetAddr>10005</InetAddr>"))
    assert [t.type for t in cfg.transports] == ["replication"]
    two = config_xml("<Transports><Transport><Name>r1</Name><Type>amps-replication</Type><InetAddr>10005</InetAddr>"
                     "</Transport><Transport><Name>r2</Name><Type>amps-replication</Type>"
                     "<InetAddr>10006</InetAddr></Transport></Transports>")
    refused(two, "AMPSConfig/Transports/Transport[2]", "a second incoming replication transport",
            hint="at most one")


def test_unknown_transport_type_and_protocol():
    refused(_transports("<Type>udp</Type><InetAddr>9007</InetAddr>"), f"{T1}/Type",
            "'udp' is not a valid <Type>", hint="tcp, amps")
    refused(_transports("<Protocol>fix</Protocol><InetAddr>9007</InetAddr>"), f"{T1}/Protocol",
            "'fix' is not a valid <Protocol>", hint="conveyor, amps")


def test_journal_size_and_its_synonym_together():
    xml = config_xml(txlog_extra="<JournalSize>1G</JournalSize><MinJournalSize>1G</MinJournalSize>")
    refused(xml, "AMPSConfig/TransactionLog/MinJournalSize", "both set the segment size",
            hint="keep one of them")


def test_journal_size_minimum():
    refused(config_xml(txlog_extra="<JournalSize>512K</JournalSize>"),
            "AMPSConfig/TransactionLog/JournalSize", "below the minimum of 1048576 bytes",
            hint="at least 1M")


def test_checkpoint_size():
    assert loads(config_xml()).transaction_log.checkpoint_bytes == 16 * 1024 * 1024
    assert loads(config_xml(txlog_extra="<CheckpointSize>4M</CheckpointSize>")).transaction_log.checkpoint_bytes == 4 << 20
    assert loads(config_xml(txlog_extra="<CheckpointSize>0</CheckpointSize>")).transaction_log.checkpoint_bytes == 0
    refused(config_xml(txlog_extra="<CheckpointSize>-1M</CheckpointSize>"),
            "AMPSConfig/TransactionLog/CheckpointSize", "is not a size", hint="512K")


def _replication(dest: str) -> str:
    return f"<Replication><Destination>{dest}</Destination></Replication>"


_DEST = ("<Name>east</Name><SyncType>{sync}</SyncType>"
         "<Transport><Type>amps-replication</Type><InetAddr>{addr}</InetAddr></Transport>"
         "<Topic><Name>{topic}</Name><MessageType>json</MessageType></Topic>")
D1 = "AMPSConfig/Replication/Destination[1]"


def test_replication_sync_type():
    refused(config_xml(_replication(_DEST.format(sync="eventually", addr="h:1", topic=".*"))),
            f"{D1}/SyncType", "'eventually' is not a valid <SyncType>", hint="sync, async")


def test_replication_address_needs_a_host():
    refused(config_xml(_replication(_DEST.format(sync="sync", addr="10005", topic=".*"))),
            f"{D1}/Transport[1]/InetAddr[1]", "has no host", hint="HOST:PORT")


def test_local_queue_cannot_be_replicated():
    sow = "<SOW><LocalQueue><Name>Work</Name><MessageType>json</MessageType></LocalQueue></SOW>"
    refused(config_xml(sow + _replication(_DEST.format(sync="async", addr="h:1", topic=".*"))),
            f"{D1}/Topic[1]/Name", "replicates LocalQueue 'Work'",
            hint="replicate the queue's underlying topics instead")


def test_duplicate_destination_names():
    dest = _DEST.format(sync="sync", addr="h:1", topic="Work")
    xml = config_xml(f"<Replication><Destination>{dest}</Destination>"
                     f"<Destination>{dest}</Destination></Replication>")
    refused(xml, "AMPSConfig/Replication/Destination[2]", "'east' is already used",
            hint="its own <Name>")


def test_bad_boolean():
    refused(_jobs(_action(do_extra="<Delta>yes</Delta>")), f"{A1}/Do[1]/Options/Delta",
            "'yes' is not a valid <Delta>", hint="use one of: true, false")


def test_preallocated_journal_files_must_be_positive():
    refused(config_xml(txlog_extra="<PreallocatedJournalFiles>0</PreallocatedJournalFiles>"),
            "AMPSConfig/TransactionLog/PreallocatedJournalFiles", "must be a positive integer",
            hint="positive integer")


def test_retention_age_must_be_positive():
    refused(config_xml(txlog_extra="<Retention><MaxAge>0</MaxAge></Retention>"),
            "AMPSConfig/TransactionLog/Retention/MaxAge", "must be longer than zero",
            hint="positive duration")


def test_recorded_topic_regex_must_compile():
    refused(config_xml(topics=("Work", "[unclosed")), "AMPSConfig/TransactionLog/Topic[2]/Name",
            "'[unclosed' is not a valid regular expression", hint="Python regular-expression")


def test_default_publish_target_must_be_literal():
    refused(_regex_queue("ORDERS_.*", ("ORDERS",)), f"{Q1}/DefaultPublishTarget",
            "must be a topic name, not a regular expression", hint="literal name")


def test_pass_through_must_compile():
    dest = _DEST.format(sync="sync", addr="h:1", topic="Work") + "<PassThrough>(</PassThrough>"
    refused(config_xml(_replication(dest)), f"{D1}/PassThrough",
            "is not a valid regular expression", hint="regex of group names")


def test_a_replicated_queue_may_have_a_target_queue_depth():
    """Replicated queues keep their window (engine/queue/bindings.py rule 7)."""
    sow = queue_xml("<TargetQueueDepth>10</TargetQueueDepth>")
    loads(config_xml(sow + _replication(_DEST.format(sync="async", addr="h:1", topic=".*"))))


def test_a_replicated_queue_may_have_an_ordering_key():
    """Per-key ordering holds across instances (queue/keys.py rule 6): accepted."""
    sow = queue_xml("<OrderingKey>/customer</OrderingKey>")
    loads(config_xml(sow + _replication(_DEST.format(sync="async", addr="h:1", topic=".*"))))


def test_a_queue_replicated_elsewhere_may_keep_its_target_queue_depth():
    sow = queue_xml("<TargetQueueDepth>10</TargetQueueDepth>")
    loads(config_xml(sow + _replication(_DEST.format(sync="async", addr="h:1", topic="Work"))))


def test_a_replicated_queue_does_not_take_from_a_view():
    sow = ("<SOW><Topic><Name>Orders</Name><MessageType>json</MessageType><Key>/id</Key></Topic>"
           "<View><Name>Totals</Name><MessageType>json</MessageType><UnderlyingTopic>Orders</UnderlyingTopic>"
           "<Projection><Field>/id</Field></Projection><Grouping><Field>/id</Field></Grouping></View>"
           "<Queue><Name>Q</Name><MessageType>json</MessageType><UnderlyingTopic>Totals</UnderlyingTopic></Queue>"
           "</SOW>")
    refused(config_xml(sow + _replication(_DEST.format(sync="async", addr="h:1", topic=".*")),
                       topics=("Work", "Orders", "Totals")),
            "AMPSConfig/SOW/Queue[1]", "its underlying topic is view 'Totals'", hint="make the queue a LocalQueue")
