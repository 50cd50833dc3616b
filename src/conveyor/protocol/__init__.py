"""The wire protocol: frames <-> typed commands and messages, with no I/O."""

from conveyor.protocol.codec import (
    FRAME_BYTES_MAX_DEFAULT,
    CommandDecoder,
    MessageDecoder,
    Rejected,
    encode_frame,
    encode_frames,
)
from conveyor.protocol.messages import *  # noqa: F401,F403
from conveyor.protocol.ack_kinds import ack_types
from conveyor.protocol.options import Options, parse_options

__all__ = [
    "FRAME_BYTES_MAX_DEFAULT",
    "CommandDecoder",
    "MessageDecoder",
    "Rejected",
    "encode_frame",
    "encode_frames",
    "ack_types",
    "Options",
    "parse_options",
]
