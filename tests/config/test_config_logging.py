"""``<Logging>``: targets read into LogTarget, every element that would mean less than it
says refused with its path (docs/configuration.md, "Logging")."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from conveyor.config import load_text
from conveyor.config.model import LOG_ROTATION_BYTES_DEFAULT, LOG_ROTATION_COUNT_DEFAULT
from tests.config.config_helpers import config_xml, refused

T1 = "AMPSConfig/Logging/Target[1]"


def logging_xml(*targets: str) -> str:
    return config_xml("<Logging>" + "".join(f"<Target>{t}</Target>" for t in targets) + "</Logging>")


def test_targets_with_levels_files_and_rotation():
    config = load_text(logging_xml(
        "<Protocol>file</Protocol><FileName>logs/conveyor.log</FileName><Level>debug</Level>"
        "<RotationThreshold>10M</RotationThreshold><RotationCount>3</RotationCount>",
        "<Protocol>stdout</Protocol><Level>warning</Level>",
        "<Protocol>gzip</Protocol><FileName>logs/archive.log</FileName>",
    ))
    file_target, stdout, gz = config.logging
    assert (file_target.protocol, file_target.level, file_target.file_name) == ("file", logging.DEBUG,
                                                                                 Path("logs/conveyor.log"))
    assert (file_target.rotation_bytes, file_target.rotation_count) == (10 * 1024 * 1024, 3)
    assert (stdout.protocol, stdout.level, stdout.file_name) == ("stdout", logging.WARNING, None)
    assert gz.level == logging.INFO  # the default level
    assert (gz.rotation_bytes, gz.rotation_count) == (LOG_ROTATION_BYTES_DEFAULT, LOG_ROTATION_COUNT_DEFAULT)
    assert file_target.path == T1


@pytest.mark.parametrize("level, expected", [("trace", logging.DEBUG), ("stats", logging.INFO),
                                             ("Emergency", logging.CRITICAL), ("none", logging.CRITICAL + 10)])
def test_reference_levels_map_to_python_levels(level, expected):
    (target,) = load_text(logging_xml(f"<Protocol>stderr</Protocol><Level>{level}</Level>")).logging
    assert target.level == expected


def test_no_logging_element_means_no_targets():
    assert load_text(config_xml()).logging == ()


def test_logging_needs_a_target():
    refused(config_xml("<Logging/>"), "AMPSConfig/Logging", "missing the required element <Target>")


def test_target_needs_a_protocol():
    refused(logging_xml("<Level>info</Level>"), T1, "missing <Protocol>",
            hint="<Protocol>file</Protocol>")


def test_unknown_protocol_and_level_list_the_valid_ones():
    refused(logging_xml("<Protocol>kafka</Protocol>"), f"{T1}/Protocol",
            "'kafka' is not a valid <Protocol>", hint="file, gzip, stdout, stderr")
    refused(logging_xml("<Protocol>stdout</Protocol><Level>loud</Level>"), f"{T1}/Level",
            "'loud' is not a valid <Level>", hint="trace")


def test_syslog_is_refused_with_a_way_out():
    refused(logging_xml("<Protocol>syslog</Protocol>"), f"{T1}/Protocol",
            "syslog targets are not supported", hint="stdout")


def test_file_target_needs_a_file_name():
    refused(logging_xml("<Protocol>file</Protocol>"), T1, "needs <FileName>")


def test_file_name_tokens_are_refused():
    refused(logging_xml("<Protocol>file</Protocol><FileName>logs/%Y%m%d-%n.log</FileName>"),
            f"{T1}/FileName", "% tokens", hint="FILE.1, FILE.2")


def test_file_elements_on_a_console_target_are_refused():
    refused(logging_xml("<Protocol>stdout</Protocol><RotationThreshold>1M</RotationThreshold>"),
            f"{T1}/RotationThreshold", "applies to file and gzip targets, not stdout")


@pytest.mark.parametrize("tag", ["IncludeErrors", "ExcludeErrors", "Levels"])
def test_error_selection_elements_are_refused(tag):
    refused(logging_xml(f"<Protocol>stdout</Protocol><{tag}>x</{tag}>"),
            f"{T1}/{tag}", f"<{tag}> is not supported in <Target>")


def test_rotation_values_are_checked():
    refused(logging_xml("<Protocol>file</Protocol><FileName>a.log</FileName><RotationThreshold>0</RotationThreshold>"),
            f"{T1}/RotationThreshold", "larger than zero")
    refused(logging_xml("<Protocol>file</Protocol><FileName>a.log</FileName><RotationCount>0</RotationCount>"),
            f"{T1}/RotationCount", "positive integer")
