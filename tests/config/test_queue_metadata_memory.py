"""``<Limits><QueueMetadataMemory>`` (the FileBackedMetadata budget) and FileBackedMetadata
on a priority queue, accepted since its delivery index is paged too."""

from __future__ import annotations

import pytest

from conveyor.config import load_text
from conveyor.config.model import QUEUE_METADATA_MEMORY_BYTES_DEFAULT
from conveyor.config.unsupported import unsupported
from conveyor.config.validation import validate
from conveyor.server.checkpoints import page_files

from tests.config.config_helpers import config_xml, queue_xml, refused


def limits(inner: str) -> str:
    return config_xml(f"<Limits>{inner}</Limits>")


def test_the_default_is_one_gibibyte():
    config = load_text(config_xml())
    assert config.limits.queue_metadata_memory_bytes == QUEUE_METADATA_MEMORY_BYTES_DEFAULT == 2**30


@pytest.mark.parametrize("text, expected", [("512MB", 512 * 2**20), ("2GB", 2 * 2**30), ("64M", 64 * 2**20),
                                            ("1000000", 1_000_000)])
def test_a_size(text, expected):
    config = load_text(limits(f"<QueueMetadataMemory>{text}</QueueMetadataMemory>"))
    assert config.limits.queue_metadata_memory_bytes == expected


@pytest.mark.parametrize("text", ["lots", "0", "-1G", "12 parsecs"])
def test_a_bad_size_is_refused_with_its_path(text):
    refused(limits(f"<QueueMetadataMemory>{text}</QueueMetadataMemory>"), "AMPSConfig/Limits/QueueMetadataMemory")


def test_the_server_builds_its_budget_from_it(tmp_path):
    config = load_text(limits("<QueueMetadataMemory>3M</QueueMetadataMemory>"))
    files = page_files(tmp_path, config.limits.queue_metadata_memory_bytes)
    assert files.budget.limit == 3 * 2**20
    assert page_files(tmp_path).budget.limit == QUEUE_METADATA_MEMORY_BYTES_DEFAULT


def test_file_backed_metadata_on_a_priority_queue_is_accepted():
    config = load_text(config_xml(queue_xml(
        "<Priority>/p</Priority><BarrierExpression>/b = 1</BarrierExpression>"
        "<FileBackedMetadata>enabled</FileBackedMetadata>")))
    (queue,) = config.queues
    assert queue.file_backed_metadata and queue.priority == "/p"
    assert unsupported(config) == []
    validate(config)  # as conveyor serve does before it starts
