"""A minimal, bounded reader of the protobuf wire format, enough to list what an ONNX model or a TensorFlow
SavedModel asks its runtime to run, without the onnx or tensorflow packages and without building any object.

Only the wire format is read (varints, 64/32-bit fixed fields, length-delimited fields); a message is a list of
``(field number, wire type, value)`` with length-delimited values as bytes, parsed further by the caller where the
schema says the field is a message. Every length is checked against the bytes that are left, nesting is bounded,
and a malformed stream raises :class:`ProtobufError` (the scanner reports the file as malformed) instead of reading
out of bounds.

Example:
    >>> fields(b"\\x08\\x96\\x01\\x12\\x02hi")
    [(1, 0, 150), (2, 2, b'hi')]
"""

from __future__ import annotations

MAX_FIELDS = 5_000_000  # a message with more fields than this is refused (a crafted file, not a model)


class ProtobufError(ValueError):
    """The bytes are not a well-formed protobuf message."""


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if pos >= len(buf):
            raise ProtobufError("truncated varint")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise ProtobufError("varint longer than 10 bytes")


def fields(buf: bytes) -> list[tuple[int, int, int | bytes]]:
    """The fields of one message, in order: ``(number, wire type, int or bytes)``.

    Raises:
        ProtobufError: a truncated or malformed message (a length past the end, an unknown wire type).
    """
    out: list[tuple[int, int, int | bytes]] = []
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise ProtobufError("field number 0")
        if wire == 0:
            value, pos = _varint(buf, pos)
            out.append((number, wire, value))
        elif wire == 1 or wire == 5:
            size = 8 if wire == 1 else 4
            if pos + size > len(buf):
                raise ProtobufError("truncated fixed-width field")
            out.append((number, wire, int.from_bytes(buf[pos:pos + size], "little")))
            pos += size
        elif wire == 2:
            size, pos = _varint(buf, pos)
            if pos + size > len(buf):
                raise ProtobufError(f"field {number}: length {size} past the end of the message")
            out.append((number, wire, buf[pos:pos + size]))
            pos += size
        else:
            raise ProtobufError(f"field {number}: wire type {wire} (groups are not used by these formats)")
        if len(out) > MAX_FIELDS:
            raise ProtobufError("too many fields")
    return out


def submessages(buf: bytes, number: int) -> list[bytes]:
    """The length-delimited values of field `number` (repeated message fields, strings)."""
    return [v for n, w, v in fields(buf) if n == number and w == 2 and isinstance(v, bytes)]


def string(buf: bytes, number: int, default: str = "") -> str:
    """The last string value of field `number` (UTF-8, undecodable bytes replaced)."""
    vals = submessages(buf, number)
    return vals[-1].decode("utf-8", "replace") if vals else default
