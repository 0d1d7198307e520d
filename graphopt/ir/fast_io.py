"""Fast file I/O for big ONNX models: memory-mapped weights, no needless copies.

`load_model` / `save_model` in `onnx_io` call in here; everything returns None or
False when it does not apply, and the caller then takes onnx-ir's ordinary path.
Nothing here changes what a model means, only how its bytes travel.

Loading a single-file model (`map_model`)
    A protobuf parse of a 440 MB model copies every weight into Python bytes
    objects (and onnx-ir copies again on each `numpy()`). Instead we mmap the file
    and walk the protobuf wire format by hand, which is cheap because we only
    descend where the weights are: ModelProto.graph (field 7) ->
    GraphProto.initializer (field 5) -> TensorProto.raw_data (field 9). We then
    parse a *skeleton*: the file's bytes with the raw_data field cut out of every
    big main-graph initializer (about 1 MB for BERT-base instead of 438 MB). onnx-ir
    deserializes the skeleton as usual, so every Value, type, shape, value_info and
    graph input is exactly what the ordinary path makes; `attach` then gives each
    cut initializer a `MappedTensor`, an `ir.Tensor` whose array is
    `np.frombuffer` over the mmap (zero copy, read-only like onnx-ir's own arrays).

    Only plain tensors are cut: raw_data present, no typed data fields (float_data
    ...), no segments, not external, a byte-aligned dtype numpy can view, and a
    raw_data length that matches dims x itemsize. Everything else (and every
    subgraph / function tensor) stays in the skeleton and is parsed by protobuf
    as before, so odd tensors take the well-trodden path.

    Why not `ir.ExternalTensor` pointing at the .onnx file itself (location =
    model.onnx, offset = where raw_data starts)? It would work for reading, but
    the rest of graphopt (and onnx-ir's serializer) would then see an
    "external-data model": the output layout choice, the CLI's input guard,
    `--verify` and every `serialize_model` would emit references into the input
    file. An `ir.Tensor` subclass is indistinguishable from an in-memory tensor.

Saving (`save_single_file`, `save_with_external_data`)
    * Single-file output: weights that came untouched from a mapped input are not
      re-serialized. We serialize the model with every main-graph initializer's
      tensor replaced by an empty placeholder (so value_info, graph inputs and
      annotations are exactly onnx-ir's), drop the placeholders from the
      GraphProto, and write the ModelProto by hand: the graph field is re-emitted
      with its initializers spliced in at their canonical place, in the model's
      initializer order; untouched ones are copied from the input file with
      `os.copy_file_range` (in the kernel; adjacent ones coalesced into one
      call), new or changed ones serialized by onnx-ir (those of 1 MiB or more one
      at a time, as they are written, so their bytes are never all in memory at
      once). The result parses to the same ModelProto as onnx-ir's `save` writes.
    * External-data output: when most bytes (> 90%) of the input's data file are
      still referenced, the output data file starts as an in-kernel copy of it, so
      untouched tensors keep their offsets, and only new tensors are appended
      (64-byte aligned, 4096 from 1 MiB). Otherwise each tensor is streamed into a
      compact file (kernel copies for mapped and external tensors), or, when no
      tensor is mapped, onnx-ir's own writer does that. Tensors are swapped for
      `ExternalTensor`s into the new file for the duration of onnx-ir's
      serialization of the (small) model and restored afterwards, also on error.
      Small tensors (<= 256 bytes, onnx-ir's threshold) stay inline, except those
      already external in a reused file.

    Both write into the caller's staging folder; `save_model` renames into place,
    so an input that is also the output is never truncated while mapped (the old
    inode lives on until its maps are gone).

Set GRAPHOPT_FAST_IO=0 (or `fast_io.ENABLED = False`) to use onnx-ir's paths only.
"""

from __future__ import annotations

import errno
import math
import mmap
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
import onnx
import onnx_ir as ir

__all__ = [
    "ENABLED",
    "MIN_MAPPED_FILE_BYTES",
    "MIN_MAPPED_TENSOR_BYTES",
    "MappedTensor",
    "MappedModel",
    "map_model",
    "save_single_file",
    "save_with_external_data",
]

#: Master switch (also the GRAPHOPT_FAST_IO environment variable): False = onnx-ir paths only.
ENABLED = os.environ.get("GRAPHOPT_FAST_IO", "1").lower() not in ("0", "false", "no", "off")
#: Single-file models smaller than this are loaded by onnx-ir's ordinary protobuf parse.
MIN_MAPPED_FILE_BYTES = 32 << 20
#: Initializers with less raw_data than this stay in the skeleton (parsing them is free).
MIN_MAPPED_TENSOR_BYTES = 1024
#: onnx-ir `save`'s default: initializers up to this size stay inside the .onnx file.
EXTERNAL_SIZE_THRESHOLD = 256
#: Reuse the input's data file (copy it whole, keep offsets) when more than this share of it is still used.
REUSE_DATA_FILE_RATIO = 0.9
MAX_PROTOBUF_BYTES = 2**31 - 1
#: New initializers at least this big are serialized only as they are written (single-file save).
DEFER_SERIALIZATION_BYTES = 1 << 20

# Protobuf wire types and the field numbers we walk (onnx.proto).
_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5
_MODEL_GRAPH = 7
_GRAPH_INITIALIZER = 5
_T_DIMS, _T_DATA_TYPE, _T_NAME, _T_RAW_DATA, _T_DATA_LOCATION = 1, 2, 8, 9, 14
#: TensorProto fields that may hold data or change where it lives: segment, float/int32/string/
#: int64/double/uint64 data, external_data. A tensor with any of them is left to protobuf.
_T_OTHER_DATA = frozenset({3, 4, 5, 6, 7, 10, 11, 13})


def _mappable_dtypes() -> dict[int, np.dtype]:
    """ONNX data types whose raw_data numpy can view directly (little-endian, whole bytes);
    bfloat16 / float8 come through ml_dtypes, as in onnx-ir. Packed 2/4/6-bit types are left out."""
    table = {}
    for dtype in ir.DataType:
        if dtype in (ir.DataType.UNDEFINED, ir.DataType.STRING) or dtype.bitwidth % 8:
            continue
        try:
            table[dtype.value] = np.dtype(dtype.numpy()).newbyteorder("<")
        except (TypeError, ValueError, NotImplementedError):
            continue
    return table


_NUMPY_DTYPES = _mappable_dtypes()


# --------------------------------------------------------------------------- wire format


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


# --------------------------------------------------------------------------- loading


@dataclass(frozen=True)
class _Entry:
    """A main-graph initializer whose raw_data is cut out of the skeleton."""

    name: str
    start: int  #: the whole `initializer` field (key, length, TensorProto) is file[start:end]
    data: int  #: where the TensorProto itself begins
    end: int
    raw_start: int  #: raw_data's payload is file[raw_start:raw_end]
    raw_end: int
    raw_field_start: int  #: raw_data's key begins here (cut up to raw_end)
    dtype: np.dtype
    dims: tuple[int, ...]


class _MappedFile:
    """An input file, memory-mapped read-only, kept open for kernel copies of its ranges."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.file: BinaryIO = open(path, "rb")  # noqa: SIM115 - lives as long as its tensors
        try:
            self.mm = mmap.mmap(self.file.fileno(), 0, access=mmap.ACCESS_READ)
        except BaseException:
            self.file.close()
            raise

    def array(self, entry: _Entry) -> np.ndarray:
        count = (entry.raw_end - entry.raw_start) // entry.dtype.itemsize
        return np.frombuffer(self.mm, dtype=entry.dtype, count=count, offset=entry.raw_start).reshape(entry.dims)


class MappedTensor(ir.Tensor):  # type: ignore[type-arg]
    """An `ir.Tensor` whose array views the memory-mapped input file (no copy).

    It remembers where its TensorProto lies in that file and what its name,
    doc_string and metadata were, so a save can copy those bytes unchanged."""

    __slots__ = ("_entry", "_origin", "_source")

    def __init__(
        self, source: _MappedFile, entry: _Entry, dtype: ir.DataType, *, doc_string: str | None, metadata_props: dict[str, str] | None
    ) -> None:
        super().__init__(source.array(entry), dtype, name=entry.name, doc_string=doc_string, metadata_props=metadata_props)
        self._source = source
        self._entry = entry
        self._origin = (entry.name, doc_string or "", dict(metadata_props or {}))

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        """Pickling / deepcopy give a plain in-memory `ir.Tensor` (a copy; the map and file stay here)."""
        return _in_memory_tensor, (np.array(self.numpy()), self.dtype, self.name, self.doc_string, dict(self.metadata_props) or None)

    def unchanged_as(self, name: str | None) -> bool:
        """Would serializing this tensor as initializer `name` give the bytes it came from?"""
        origin_name, origin_doc, origin_meta = self._origin
        return name == origin_name and (self.doc_string or "") == origin_doc and dict(self.metadata_props) == origin_meta


def _in_memory_tensor(
    array: np.ndarray, dtype: ir.DataType, name: str | None, doc_string: str | None, metadata_props: dict[str, str] | None
) -> ir.Tensor:  # type: ignore[type-arg]
    return ir.Tensor(array, dtype, name=name, doc_string=doc_string, metadata_props=metadata_props)


@dataclass
class MappedModel:
    """The result of `map_model`: a skeleton to deserialize, and the tensors to attach after."""

    skeleton: onnx.ModelProto
    source: _MappedFile
    entries: dict[str, _Entry]

    def attach(self, model: ir.Model) -> None:
        """Give every cut main-graph initializer of `model` (deserialized from the skeleton)
        its memory-mapped tensor."""
        attached = 0
        for value in model.graph.initializers.values():
            entry = self.entries.get(value.name or "")
            stub = value.const_value
            if entry is None or stub is None:
                continue
            dtype = ir.DataType(stub.dtype)
            value.const_value = MappedTensor(
                self.source, entry, dtype, doc_string=stub.doc_string or None, metadata_props=dict(stub.metadata_props) or None
            )
            attached += 1
        if attached != len(self.entries):  # cannot happen with onnx-ir's deserializer; never leave data out silently
            raise RuntimeError(f"fast load: {len(self.entries) - attached} initializers were not found after deserialization")


def _is_protobuf_path(path: Path) -> bool:
    """onnx.load/save pick the format from the extension (.textproto, .json ...); protobuf is the default."""
    fmt = onnx.serialization.registry.get_format_from_file_extension(path.suffix)
    return fmt in (None, "protobuf")


def map_model(path: str | os.PathLike[str], min_file_bytes: int | None = None) -> MappedModel | None:
    """Memory-map a single-file model and build its skeleton; None when the ordinary
    load is as good (small file, disabled, not protobuf, or an unusual layout).
    OSError propagates; a skeleton that does not parse raises protobuf's DecodeError."""
    path = Path(path)
    threshold = MIN_MAPPED_FILE_BYTES if min_file_bytes is None else min_file_bytes
    if not ENABLED or not _is_protobuf_path(path) or path.stat().st_size < max(threshold, 1):
        return None
    source = _MappedFile(path)
    try:
        found = _scan(source.mm)
    except _Unusual:
        found = None
    if not found:  # nothing worth cutting: the ordinary parse costs the same
        source.mm.close()
        source.file.close()
        return None
    graph_field, entries = found
    skeleton = onnx.ModelProto()
    skeleton.ParseFromString(_skeleton_bytes(source.mm, graph_field, entries))
    return MappedModel(skeleton, source, {e.name: e for e in entries})


def _scan(buf: mmap.mmap) -> tuple[_Field, list[_Entry]] | None:
    """Find the graph field and the main-graph initializers worth cutting."""
    graphs = [f for f in _fields(buf, 0, len(buf)) if f.number == _MODEL_GRAPH]
    if len(graphs) != 1 or graphs[0].wire_type != _LEN:
        return None  # no graph, or a graph split over several fields (protobuf would merge them)
    graph = graphs[0]
    entries, names = [], set()
    for field in _fields(buf, graph.data, graph.end):
        if field.number != _GRAPH_INITIALIZER or field.wire_type != _LEN:
            continue
        entry = _scan_tensor(buf, field)
        if entry is None:
            continue
        if entry.name in names:
            return None  # duplicate initializer names: let the ordinary path deal with it
        names.add(entry.name)
        entries.append(entry)
    return (graph, entries) if entries else None


def _scan_tensor(buf: mmap.mmap, field: _Field) -> _Entry | None:
    """Read a TensorProto's small fields; an _Entry if its raw_data can be cut out and mapped."""
    dims: list[int] = []
    data_type = name = raw = None
    raw_fields = 0
    for f in _fields(buf, field.data, field.end):
        if f.number == _T_DIMS:
            if f.wire_type == _VARINT:
                dims.append(f.data)
            elif f.wire_type == _LEN:  # packed (proto3 writers)
                pos = f.data
                while pos < f.end:
                    dim, pos = _read_varint(buf, pos, f.end)
                    dims.append(dim)
            else:
                return None
        elif f.number == _T_DATA_TYPE and f.wire_type == _VARINT:
            data_type = f.data
        elif f.number == _T_NAME and f.wire_type == _LEN:
            try:
                name = bytes(buf[f.data : f.end]).decode("utf-8")
            except UnicodeDecodeError:
                raise _Unusual("initializer name is not UTF-8") from None
        elif f.number == _T_RAW_DATA and f.wire_type == _LEN:
            raw = f
            raw_fields += 1
        elif f.number == _T_DATA_LOCATION:
            if f.wire_type != _VARINT or f.data != 0:
                return None  # external (or garbled)
        elif f.number in _T_OTHER_DATA or f.number in (_T_DIMS, _T_DATA_TYPE, _T_NAME, _T_RAW_DATA):
            return None  # typed data fields, segments, external data, or an odd wire type
    if not name or raw is None or raw_fields != 1 or data_type not in _NUMPY_DTYPES:
        return None
    dtype = _NUMPY_DTYPES[data_type]
    length = raw.end - raw.data
    if length < max(MIN_MAPPED_TENSOR_BYTES, 1) or any(d >= 2**62 for d in dims):
        return None  # small (or a negative dim, which reads as a huge varint)
    if math.prod(dims) * dtype.itemsize != length:
        return None  # size mismatch: leave the complaint to the ordinary path
    return _Entry(name, field.start, field.data, field.end, raw.data, raw.end, raw.start, dtype, tuple(dims))


def _skeleton_bytes(buf: mmap.mmap, graph: _Field, entries: Sequence[_Entry]) -> bytes:
    """The file with each entry's raw_data field cut out (and the lengths around it redone)."""
    view = memoryview(buf)  # slices of it are views, not copies; join copies each piece once
    graph_pieces: list[bytes | memoryview] = []
    pos = graph.data
    for e in entries:
        graph_pieces.append(view[pos : e.start])
        payload = [view[e.data : e.raw_field_start], view[e.raw_end : e.end]]
        graph_pieces.append(_len_header(_GRAPH_INITIALIZER, sum(len(p) for p in payload)))
        graph_pieces.extend(payload)
        pos = e.end
    graph_pieces.append(view[pos : graph.end])
    graph_length = sum(len(p) for p in graph_pieces)
    return b"".join([view[: graph.start], _len_header(_MODEL_GRAPH, graph_length), *graph_pieces, view[graph.end :]])


# --------------------------------------------------------------------------- writing


_COPY_FALLBACK_ERRNOS = {errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EPERM, errno.EBADF}


class _Writer:
    """Sequential writer on an unbuffered file: bytes through write(), ranges of other
    files through os.copy_file_range (in the kernel), falling back to read + write."""

    def __init__(self, file: BinaryIO) -> None:
        self.file = file
        self.pos = 0
        self._kernel_copy = hasattr(os, "copy_file_range")

    def write(self, data: bytes | memoryview) -> None:
        view = memoryview(data)
        while view:
            written = self.file.write(view)
            if not written:
                raise OSError(errno.EIO, "short write")
            view = view[written:]
            self.pos += written

    def pad_to(self, alignment: int) -> None:
        gap = -self.pos % alignment
        if gap:
            self.write(bytes(gap))

    def copy(self, source: BinaryIO, offset: int, length: int) -> None:
        """Append source[offset : offset + length]."""
        done = 0
        if self._kernel_copy:
            try:
                while done < length:
                    # offset_dst None: the kernel writes at (and advances) our file position.
                    copied = os.copy_file_range(source.fileno(), self.file.fileno(), min(length - done, 1 << 30), offset + done)
                    if copied == 0:
                        raise OSError(errno.EIO, f"{getattr(source, 'name', 'input')} ended early")
                    done += copied
                    self.pos += copied
            except OSError as error:
                if error.errno not in _COPY_FALLBACK_ERRNOS:
                    raise
                self._kernel_copy = False  # e.g. an old kernel or a filesystem that refuses
        while done < length:
            source.seek(offset + done)
            chunk = source.read(min(length - done, 16 << 20))
            if not chunk:
                raise OSError(errno.EIO, f"{getattr(source, 'name', 'input')} ended early")
            self.write(chunk)
            done += len(chunk)


# --------------------------------------------------------------------------- single-file save


def save_single_file(model: ir.Model, path: str | os.PathLike[str]) -> bool:
    """Write `model` to `path` as one protobuf, copying untouched mapped initializers
    byte for byte. False (nothing written) when no initializer can be reused."""
    path = Path(path)
    if not ENABLED or not _is_protobuf_path(path):
        return False
    values = [v for v in model.graph.initializers.values() if v.const_value is not None]
    reused = {id(v) for v in values if isinstance(v.const_value, MappedTensor) and v.const_value.unchanged_as(v.name)}
    if not reused:
        return False

    head, graph_bytes = _serialize_without_initializers(model)
    # One item per initializer: an original byte range, freshly serialized bytes, or (for a
    # big new tensor) the tensor and its serialized size: it is serialized again while
    # writing, so at most one big new tensor's bytes are in memory at a time.
    items: list[tuple[_MappedFile, int, int] | bytes | _Deferred] = []
    for value in values:
        tensor = value.const_value
        assert tensor is not None
        if id(value) in reused:
            assert isinstance(tensor, MappedTensor)
            source, entry = tensor._source, tensor._entry
            last = items[-1] if items else None
            if isinstance(last, tuple) and last[0] is source and last[2] == entry.start:
                items[-1] = (source, last[1], entry.end)  # adjacent in the input: one copy
            else:
                items.append((source, entry.start, entry.end))
        else:
            tensor.name = value.name  # as onnx-ir's serializer does
            proto = ir.serde.serialize_tensor(tensor)
            if tensor.nbytes >= DEFER_SERIALIZATION_BYTES:
                size = proto.ByteSize()
                items.append(_Deferred(tensor, size, len(_len_header(_GRAPH_INITIALIZER, size)) + size))
            else:
                data = proto.SerializeToString()
                items.append(_len_header(_GRAPH_INITIALIZER, len(data)) + data)
            del proto
    initializer_bytes = sum(item[2] - item[1] if isinstance(item, tuple) else item.length if isinstance(item, _Deferred) else len(item) for item in items)
    graph_length = len(graph_bytes) + initializer_bytes
    if len(head) + graph_length + 16 > MAX_PROTOBUF_BYTES:
        return False  # too big for one protobuf: let onnx-ir report it

    # Fields go where protobuf would put them (ordered by number), so the file reads like
    # onnx-ir's output: initializers (5) after node/name (1, 2), graph (7) before opset_import (8).
    graph_split = _first_field_after(graph_bytes, _GRAPH_INITIALIZER)
    head_split = _first_field_after(head, _MODEL_GRAPH)
    with open(path, "wb", buffering=0) as file:
        out = _Writer(file)
        out.write(memoryview(head)[:head_split])
        out.write(_len_header(_MODEL_GRAPH, graph_length))
        out.write(memoryview(graph_bytes)[:graph_split])
        for item in items:
            if isinstance(item, tuple):
                out.copy(item[0].file, item[1], item[2] - item[1])
            elif isinstance(item, _Deferred):
                data = ir.serde.serialize_tensor(item.tensor).SerializeToString()
                if len(data) != item.size:  # protobuf's serialization is deterministic; never write a corrupt length
                    raise RuntimeError(f"tensor {item.tensor.name!r} serialized to {item.size} bytes, then to {len(data)}")
                out.write(_len_header(_GRAPH_INITIALIZER, len(data)))
                out.write(data)
                del data
            else:
                out.write(item)
        out.write(memoryview(graph_bytes)[graph_split:])
        out.write(memoryview(head)[head_split:])
    return True


@dataclass(frozen=True)
class _Deferred:
    """A new initializer serialized only when written (see save_single_file)."""

    tensor: ir.TensorProtocol
    size: int  #: its TensorProto's serialized size
    length: int  #: with the field's key and length


def _serialize_without_initializers(model: ir.Model) -> tuple[bytes, bytes]:
    """(ModelProto bytes without its graph, GraphProto bytes without main-graph initializers).

    Each initializer's tensor is swapped for an empty placeholder while onnx-ir serializes,
    so everything else about initializers (value_info, graph inputs, annotations) is
    exactly what onnx-ir writes; the placeholders are then dropped from the proto."""
    values = list(model.graph.initializers.values())
    tensors = [v.const_value for v in values]
    placeholder = ir.Tensor(np.zeros(0, dtype=np.uint8))
    try:
        for value, tensor in zip(values, tensors, strict=True):
            if tensor is not None:
                value.const_value = placeholder
        proto = ir.serde.serialize_model(model)
    finally:
        for value, tensor in zip(values, tensors, strict=True):
            value.const_value = tensor
    proto.graph.ClearField("initializer")
    graph_bytes = proto.graph.SerializeToString()
    proto.ClearField("graph")
    return proto.SerializeToString(), graph_bytes


# --------------------------------------------------------------------------- external-data save


def save_with_external_data(model: ir.Model, path: str | os.PathLike[str], data_name: str) -> bool:
    """Write `model` to `path` with its weights in `data_name` beside it (relative to
    path's folder). False (nothing written) when onnx-ir's `save` would do as well:
    no mapped tensors and no input data file worth reusing whole."""
    path = Path(path)
    if not ENABLED or not _is_protobuf_path(path) or os.path.basename(data_name) != data_name:
        return False
    # Every initializer whose data goes to the data file, in onnx-ir's order (all graphs).
    # (String tensors have no raw bytes and stay in the .onnx file.)
    values = [v for graph in model.graphs() for v in graph.initializers.values() if v.const_value is not None]
    moved = [
        v
        for v in values
        if isinstance(v.const_value, ir.ExternalTensor)
        or (v.const_value.nbytes > EXTERNAL_SIZE_THRESHOLD and v.const_value.dtype != ir.DataType.STRING)  # type: ignore[union-attr]
    ]
    if any(v.const_value.dtype == ir.DataType.STRING for v in moved):  # type: ignore[union-attr]
        return False  # an external string tensor: leave that oddity to onnx-ir
    base = _data_file_to_reuse([v.const_value for v in moved if isinstance(v.const_value, ir.ExternalTensor)])
    if base is None and not any(isinstance(v.const_value, MappedTensor) for v in moved):
        return False

    placed: list[tuple[ir.Value, int, int]] = []  # value, offset, length in the new data file
    inputs: dict[str, BinaryIO] = {}
    try:
        with open(path.parent / data_name, "wb", buffering=0) as file:
            out = _Writer(file)
            if base is not None:
                inputs[base[0]] = open(base[0], "rb")  # noqa: SIM115 - closed below
                out.copy(inputs[base[0]], 0, base[1])
            for value in moved:
                tensor = value.const_value
                if isinstance(tensor, ir.ExternalTensor) and base is not None and os.path.realpath(tensor.path) == base[0]:
                    placed.append((value, tensor.offset or 0, _external_length(tensor)))
                    continue
                out.pad_to(4096 if tensor.nbytes >= 1 << 20 else 64)  # type: ignore[union-attr]
                offset = out.pos
                if isinstance(tensor, MappedTensor):
                    out.copy(tensor._source.file, tensor._entry.raw_start, tensor._entry.raw_end - tensor._entry.raw_start)
                elif isinstance(tensor, ir.ExternalTensor):
                    real = os.path.realpath(tensor.path)
                    if real not in inputs:
                        inputs[real] = open(real, "rb")  # noqa: SIM115 - closed below
                    out.copy(inputs[real], tensor.offset or 0, _external_length(tensor))
                else:
                    out.write(tensor.tobytes())  # type: ignore[union-attr]
                placed.append((value, offset, out.pos - offset))
    finally:
        for handle in inputs.values():
            handle.close()

    # Serialize with each moved tensor pointing into the new file, then put the originals back.
    originals = [(value, value.const_value) for value, _, _ in placed]
    try:
        for value, offset, length in placed:
            tensor = value.const_value
            assert tensor is not None
            value.const_value = ir.ExternalTensor(
                data_name,
                offset,
                length,
                tensor.dtype,
                shape=ir.Shape(tensor.shape.numpy()),
                name=value.name or "",
                doc_string=tensor.doc_string,
                metadata_props=dict(tensor.metadata_props) or None,
                base_dir=str(path.parent),
            )
        proto = ir.serde.serialize_model(model)
    finally:
        for value, tensor in originals:
            value.const_value = tensor
    onnx.save(proto, str(path))
    return True


def _external_length(tensor: ir.ExternalTensor) -> int:
    return tensor.length if tensor.length is not None else tensor.nbytes


def _data_file_to_reuse(tensors: Sequence[ir.ExternalTensor]) -> tuple[str, int] | None:
    """(real path, size) of the input data file to copy whole, if the tensors still use
    most of its bytes; else None. Bytes used twice are counted once."""
    spans: dict[str, list[tuple[int, int]]] = {}
    for tensor in tensors:
        start = tensor.offset or 0
        spans.setdefault(os.path.realpath(tensor.path), []).append((start, start + _external_length(tensor)))
    best = None
    for real, ranges in spans.items():
        try:
            size = os.path.getsize(real)
        except OSError:
            continue
        used, reach = 0, 0
        for start, end in sorted(ranges):
            if end > size:
                break  # a tensor past the end: not ours to judge, the ordinary path reports it
            used += max(0, end - max(start, reach))
            reach = max(reach, end)
        else:
            if size and used > REUSE_DATA_FILE_RATIO * size and (best is None or size > best[1]):
                best = (real, size)
    return best
