"""What the server parses of a message body, and the limits it checks before any parser
recurses (docs/reliability.md, "Bad input").

A body is opaque bytes to the server except where it is read as JSON: at publish on a
topic recorded with MessageType json and on every SOW topic (its key, a delta merge), a
``sow_delete``'s data, and whenever a filter, a projection, a view, a join, a delta or a
SOW key reads a message's fields. The decoder (msgspec) recurses once per nested array or
object and stops only at the interpreter's recursion limit, where it raises
``RecursionError``; invalid UTF-8 in a string raises ``UnicodeDecodeError``; a number out
of its range a ``ValidationError``. None of those may escape to the caller. Rules:

1. **Limits, named here** (``JSON_*``), are checked on the bytes *before* a decoder runs:
   the size first, the number of arrays and objects, then the nesting depth by a
   pre-scan (:func:`json_depth_over`) that never recurses and is exact for JSON:
   brackets inside strings do not count.
2. :func:`check_json` is the publish-time check (it builds nothing): a body over a limit,
   not JSON, or not UTF-8 is refused with :class:`BodyRefused`, a
   :class:`~conveyor.errors.BadMessage` (code ``bad_message``) whose text and details
   name the limit.
3. :func:`decode_json` decodes a body that passes and raises :class:`BodyRefused` for any
   other, never another exception. A number beyond a double's range (``1e400``) decodes
   as an infinity, as JavaScript reads it; an integer of more than
   ``JSON_INTEGER_DIGITS_MAX`` digits cannot be decoded and is refused.
"""

from __future__ import annotations

import json
from array import array
from itertools import accumulate
from typing import Any, Final

import msgspec

from conveyor.errors import BadMessage

#: Deepest nesting of arrays and objects in a JSON body (serde_json's default). Real
#: messages nest a handful of levels; the decoder, the filters' array comparisons, delta
#: merges and the encoders all recurse once per level, and 128 levels keep all of them
#: far below the interpreter's recursion limit (1,000 frames) wherever they are called.
JSON_DEPTH_MAX: Final = 128

#: Largest JSON body the server parses (16 MiB, the default MaxFrameSize). Decoding builds
#: Python objects several times the size of the text; this bounds one decode. A frame
#: limit raised above it does not raise it: a larger JSON body is refused on a json
#: topic, and is NULL to filters elsewhere.
JSON_BYTES_MAX = 16 * 1024 * 1024

#: Longest integer a JSON body may hold: Python refuses to convert a longer digit string
#: (sys.get_int_max_str_digits, a guard against quadratic conversion), and so does the
#: decoder.
JSON_INTEGER_DIGITS_MAX: Final = 4_300

#: Most arrays and objects in one JSON body (a million; counted as brackets, those inside
#: strings too, so a million opening brackets anywhere). Each costs a Python object of
#: 50 to 200 bytes once decoded, and the depth pre-scan time per bracket: this bounds both
#: (about 100 MB and a few tens of milliseconds) for any body.
JSON_CONTAINERS_MAX = 1_000_000

# Final: compiled code reads a Final module name as a C variable, any other one from the
# module's dict at every use (check_json runs for every publish to a json topic).
_RAW: Final = msgspec.json.Decoder(msgspec.Raw)  # checks the syntax without building anything
_DECODE = msgspec.json.Decoder().decode

_BRACKETS_ONLY = bytes(b for b in range(256) if b not in b"[]{}")  # translate(None, _): keep brackets
_STRUCTURE_ONLY = bytes(b for b in range(256) if b not in b'[]{}"')  # keep brackets and quotes
_PARENS = bytes.maketrans(b"[]{}", b"()()")
_STEPS = bytes(1 if c == 0x28 else 255 if c == 0x29 else 0 for c in range(256))  # ( -> +1, ) -> -1 (signed)
_DIGITS: Final = bytes(0x30 if 0x30 <= b <= 0x39 else 0x20 for b in range(256))  # digits -> "0", rest -> " "
_TOO_MANY_DIGITS: Final = b"0" * (JSON_INTEGER_DIGITS_MAX + 1)
_PASSES = 8  # innermost pairs removed by bytes.replace before counting what is left
_SHALLOW_BYTES_MAX: Final = 2 * JSON_DEPTH_MAX  # n bytes nest at most n / 2 levels: never too deep, nor too large


class BodyRefused(BadMessage):
    """A body the server will not parse; ``limit`` names the limit it is over (None: it
    is not JSON, or not UTF-8: ``malformed`` tells which)."""

    def __init__(self, message: str, limit: str | None = None, maximum: int | None = None, *,
                 malformed: bool = False) -> None:
        details = {} if limit is None else {"limit": limit, "max": maximum}
        super().__init__(message, **details)
        self.limit = limit
        #: Not JSON at all (bad syntax): what a binary body is. Over a limit, not UTF-8
        #: or an integer too long to convert: JSON the server cannot take.
        self.malformed = malformed


def json_depth_over(data: bytes, limit: int = JSON_DEPTH_MAX) -> bool:
    """Whether the arrays and objects of ``data`` nest more than ``limit`` levels deep
    (rule 1). Exact for JSON; for bytes that are not JSON, exact for the part a decoder
    reads before it fails, so the decoder never recurses deeper than ``limit``.

    Passes over the bytes in C: short bodies (n bytes nest at most n / 2 levels) and
    bodies with few brackets cost nothing more; a shallow one costs a pass per level;
    only what is left after eight levels is counted bracket by bracket.
    """
    if len(data) <= 2 * limit:
        return False
    structure = data.translate(None, _STRUCTURE_ONLY)  # brackets and quotes
    parens = structure.translate(_PARENS, b'"')
    if len(parens) <= limit or parens.count(b"(") <= limit:
        return False
    if b'"' in structure:  # the brackets inside strings do not count
        if b"\\" in data:
            # Escapes, in the order a decoder reads them: an escaped backslash, then an
            # escaped quote (which does not end its string); neither holds a bracket.
            data = data.replace(b"\\\\", b"").replace(b'\\"', b"")
            structure = data.translate(None, _STRUCTURE_ONLY)
        # When every quote is next to its partner here, no string holds a bracket: the
        # brackets are all outside strings. Otherwise keep what lies between pairs of
        # quotes (two adjacent quotes removed first: no bracket changes side).
        if 2 * structure.count(b'""') != structure.count(b'"'):
            structure = structure.replace(b'""', b"")
            parens = b"".join(structure.split(b'"')[::2]).translate(_PARENS)
    # Each pass removes the innermost pairs, so lowers the depth by one.
    passes = 0
    while passes < _PASSES:
        if not parens:
            return passes > limit
        inner = parens.replace(b"()", b"")
        if len(inner) == len(parens):
            break  # unbalanced (not JSON): ")))(((" is left
        parens = inner
        passes += 1
    return passes + max(accumulate(array("b", parens.translate(_STEPS))), default=0) > limit


def _check_size_and_depth(data: bytes) -> None:
    if len(data) > JSON_BYTES_MAX:
        raise BodyRefused(f"JSON body of {len(data)} bytes is over the limit of {JSON_BYTES_MAX} bytes "
                          "(JSON_BYTES_MAX)", "JSON_BYTES_MAX", JSON_BYTES_MAX)
    if len(data) > 2 * JSON_CONTAINERS_MAX:
        brackets = data.translate(None, _BRACKETS_ONLY)
        opened = brackets.count(b"[") + brackets.count(b"{")
        if opened > JSON_CONTAINERS_MAX:
            raise BodyRefused(f"JSON body of {opened} arrays and objects, over the limit of {JSON_CONTAINERS_MAX} "
                              "(JSON_CONTAINERS_MAX)", "JSON_CONTAINERS_MAX", JSON_CONTAINERS_MAX)
    if json_depth_over(data):
        raise _too_deep()


def _too_deep() -> BodyRefused:
    return BodyRefused(f"JSON body nested more than {JSON_DEPTH_MAX} levels deep, over the limit of "
                       f"{JSON_DEPTH_MAX} (JSON_DEPTH_MAX)", "JSON_DEPTH_MAX", JSON_DEPTH_MAX)


def _not_utf8(exc: UnicodeDecodeError) -> BodyRefused:
    return BodyRefused(f"JSON body is not valid UTF-8 (byte {exc.start}: {exc.reason})")


def _too_long_integer() -> BodyRefused:
    return BodyRefused(f"JSON body holds an integer of more than {JSON_INTEGER_DIGITS_MAX} digits "
                       "(JSON_INTEGER_DIGITS_MAX)", "JSON_INTEGER_DIGITS_MAX", JSON_INTEGER_DIGITS_MAX)


def check_json(data: bytes) -> None:
    """Rule 2: refuse (BodyRefused) a body over a limit, not JSON, or not UTF-8. On the
    publish path of every json topic: a body too short to nest past the limit skips the
    size and depth checks (most bodies: no call, no pass over the bytes)."""
    if len(data) > _SHALLOW_BYTES_MAX:
        _check_size_and_depth(data)
    try:
        _RAW.decode(data)
    except msgspec.DecodeError as exc:
        raise BodyRefused(f"not JSON: {exc}", malformed=True) from None
    except RecursionError:  # unreachable after the pre-scan; never let it out
        raise _too_deep() from None
    if not data.isascii():
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _not_utf8(exc) from None
    if len(data) > JSON_INTEGER_DIGITS_MAX and _TOO_MANY_DIGITS in data.translate(_DIGITS):
        decode_json(data)  # a long digit run, perhaps in a string: the decoder says


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def decode_json(data: bytes) -> Any:
    """Rule 3: the decoded body, or BodyRefused saying why not; nothing else is raised."""
    _check_size_and_depth(data)
    try:
        return _DECODE(data)
    except msgspec.ValidationError:  # a number out of range (the syntax was fine up to it)
        pass
    except msgspec.DecodeError as exc:
        raise BodyRefused(f"not JSON: {exc}", malformed=True) from None
    except UnicodeDecodeError as exc:
        raise _not_utf8(exc) from None
    except RecursionError:  # unreachable after the pre-scan; never let it out
        raise _too_deep() from None
    try:
        # The standard library reads 1e400 as infinity; a digit string longer than the
        # interpreter converts is a ValueError.
        return json.loads(data, parse_constant=_no_constant)
    except UnicodeDecodeError as exc:
        raise _not_utf8(exc) from None
    except ValueError as exc:
        if "digits" in str(exc):
            raise _too_long_integer() from None
        raise BodyRefused(f"not JSON: {exc}", malformed=True) from None
    except RecursionError:
        raise _too_deep() from None
