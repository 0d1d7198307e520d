"""Fast loading of big ONNX models: memory-mapped weights, no needless copies (and the fast I/O switch).

`load_model` in `onnx_io` calls in here; `map_model` returns None when it does not
apply, and the caller then takes onnx-ir's ordinary path. Nothing here changes what a
model means, only how its bytes travel.

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

Saving reuses the mapped bytes (graphopt.ir.fast_save); the protobuf wire format both
walk is in graphopt.ir.protobuf_wire.

Set GRAPHOPT_FAST_IO=0 (or `fast_io.ENABLED = False`) to use onnx-ir's paths only: the
switch covers loading and saving.
"""

from __future__ import annotations

import math
import mmap
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
import onnx
import onnx_ir as ir

from graphopt.ir.protobuf_wire import (
    _GRAPH_INITIALIZER,
    _LEN,
    _MODEL_GRAPH,
    _T_DATA_LOCATION,
    _T_DATA_TYPE,
    _T_DIMS,
    _T_NAME,
    _T_OTHER_DATA,
    _T_RAW_DATA,
    _VARINT,
    _Field,
    _fields,
    _is_protobuf_path,
    _len_header,
    _read_varint,
    _Unusual,
)

__all__ = [
    "ENABLED",
    "MIN_MAPPED_TENSOR_BYTES",
    "MappedTensor",
    "MappedModel",
    "map_model",
]

#: Master switch (also the GRAPHOPT_FAST_IO environment variable): False = onnx-ir paths only.
ENABLED = os.environ.get("GRAPHOPT_FAST_IO", "1").lower() not in ("0", "false", "no", "off")
#: Initializers with less raw_data than this stay in the skeleton (parsing them is free).
MIN_MAPPED_TENSOR_BYTES = 1024

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



def map_model(path: str | os.PathLike[str], min_file_bytes: int = 1) -> MappedModel | None:
    """Memory-map a single-file model and build its skeleton; None when the ordinary
    load is as good (a file below `min_file_bytes`, disabled, not protobuf, or an unusual
    layout). Which files are worth it is the caller's policy (graphopt.ir.onnx_io's
    MIN_MAPPED_FILE_BYTES). OSError propagates; a skeleton that does not parse raises
    protobuf's DecodeError."""
    path = Path(path)
    if not ENABLED or not _is_protobuf_path(path) or path.stat().st_size < max(min_file_bytes, 1):
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
