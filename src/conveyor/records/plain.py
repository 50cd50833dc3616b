"""The plain publish record, encoded from its fields: the one record the server makes
for every message published, so it is made in the compiled group (a native call from
the engine, no Python frame) and from a tuple (no Struct built first).

The layout must match :class:`conveyor.records.PublishRec`'s first fields: tag 1, topic,
publisher, sequence, timestamp, data, correlation id. tests/engine/test_records.py
decodes it as a PublishRec."""

from __future__ import annotations

from typing import Final

import msgspec

# Final: compiled code reads a Final module name as a C variable, any other one from
# the module's dict at every use.
_encoder: Final = msgspec.msgpack.Encoder()


def encode_publish(topic: str, publisher: int, seq: int, timestamp: float, data: bytes,
                   correlation_id: str | None) -> bytes:
    return _encoder.encode((1, topic, publisher, seq, timestamp, data, correlation_id))
