"""Just enough of the protobuf wire format to walk an ONNX file's bytes and write fields by hand.

graphopt's fast I/O (graphopt.ir.fast_io loads, graphopt.ir.fast_save saves) reads a
model file without parsing its weights: `_fields` lists a message's top-level fields
(number, wire type, where the payload lies), and `_len_header` writes the key and
length of a length-delimited field. Anything laid out unexpectedly raises `_Unusual`,
and the caller takes onnx-ir's ordinary path.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import onnx

# Protobuf wire types and the field numbers we walk (onnx.proto).
_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5
_MODEL_GRAPH = 7
_GRAPH_INITIALIZER = 5
_T_DIMS, _T_DATA_TYPE, _T_NAME, _T_RAW_DATA, _T_DATA_LOCATION = 1, 2, 8, 9, 14
#: TensorProto fields that may hold data or change where it lives: segment, float/int32/string/
#: int64/double/uint64 data, external_data. A tensor with any of them is left to protobuf.
_T_OTHER_DATA = frozenset({3, 4, 5, 6, 7, 10, 11, 13})


class _Unusual(Exception):
    """The bytes are not laid out the way the fast path expects: use the ordinary path."""


def _read_varint(buf: mmap.mmap | bytes | memoryview, pos: int, end: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise _Unusual("truncated or overlong varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _len_header(field: int, length: int) -> bytes:
    """Key and length of a length-delimited field."""
    return _varint(field << 3 | _LEN) + _varint(length)


@dataclass(frozen=True)
class _Field:
    number: int
    wire_type: int
    start: int  #: where the key begins
    data: int  #: where the payload begins (LEN) / the value (VARINT)
    end: int  #: one past the field's last byte


def _fields(buf: mmap.mmap | bytes | memoryview, start: int, end: int) -> Iterator[_Field]:
    """The top-level fields of the message in buf[start:end]. VARINT fields carry their value in `data`."""
    pos = start
    while pos < end:
        key, after_key = _read_varint(buf, pos, end)
        number, wire_type = key >> 3, key & 7
        if number == 0:
            raise _Unusual("field number 0")
        if wire_type == _VARINT:
            value, after = _read_varint(buf, after_key, end)
            field = _Field(number, wire_type, pos, value, after)
        elif wire_type == _LEN:
            length, data = _read_varint(buf, after_key, end)
            field = _Field(number, wire_type, pos, data, data + length)
        elif wire_type in (_I64, _I32):
            field = _Field(number, wire_type, pos, after_key, after_key + (8 if wire_type == _I64 else 4))
        else:  # groups (3, 4) are not used by onnx.proto
            raise _Unusual(f"wire type {wire_type}")
        if field.end > end:
            raise _Unusual("field runs past its message")
        yield field
        pos = field.end


def _first_field_after(data: bytes, number: int) -> int:
    """Offset of the first top-level field numbered above `number` (protobuf writes fields in
    number order, so this is where fields <= `number` would go), or len(data)."""
    for field in _fields(data, 0, len(data)):
        if field.number > number:
            return field.start
    return len(data)



def _is_protobuf_path(path: Path) -> bool:
    """onnx.load/save pick the format from the extension (.textproto, .json ...); protobuf is the default."""
    fmt = onnx.serialization.registry.get_format_from_file_extension(path.suffix)
    return fmt in (None, "protobuf")

