"""Saving big ONNX models fast: untouched memory-mapped weights copied byte for byte, in the kernel.

`onnx_io.save_model` calls in here first; each function returns False (nothing written)
when it does not apply, and the caller then takes onnx-ir's ordinary path. Loading, and
the switch that turns all of this off, are in graphopt.ir.fast_io.

Single-file output (`save_single_file`)
    Weights that came untouched from a mapped input are not re-serialized. We serialize
    the model with every main-graph initializer's tensor replaced by an empty
    placeholder (so value_info, graph inputs and annotations are exactly onnx-ir's),
    drop the placeholders from the GraphProto, and write the ModelProto by hand: the
    graph field is re-emitted with its initializers spliced in at their canonical
    place, in the model's initializer order; untouched ones are copied from the input
    file with `os.copy_file_range` (in the kernel; adjacent ones coalesced into one
    call), new or changed ones serialized by onnx-ir (those of 1 MiB or more one at a
    time, as they are written, so their bytes are never all in memory at once). The
    result parses to the same ModelProto as onnx-ir's `save` writes.

External-data output (`save_with_external_data`)
    When most bytes (> 90%) of the input's data file are still referenced, the output
    data file starts as an in-kernel copy of it, so untouched tensors keep their
    offsets, and only new tensors are appended (64-byte aligned, 4096 from 1 MiB).
    Otherwise each tensor is streamed into a compact file (kernel copies for mapped and
    external tensors), or, when no tensor is mapped, onnx-ir's own writer does that.
    Tensors are swapped for `ExternalTensor`s into the new file for the duration of
    onnx-ir's serialization of the (small) model and restored afterwards, also on
    error. Small tensors (<= 256 bytes, onnx-ir's threshold) stay inline, except those
    already external in a reused file.

Both write into the caller's staging folder; `save_model` renames into place, so an
input that is also the output is never truncated while mapped (the old inode lives on
until its maps are gone).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
import onnx
import onnx_ir as ir

from graphopt.ir import fast_io
from graphopt.ir.fast_io import MappedTensor, _MappedFile
from graphopt.ir.protobuf_wire import _GRAPH_INITIALIZER, _MODEL_GRAPH, _first_field_after, _is_protobuf_path, _len_header

__all__ = ["save_single_file", "save_with_external_data"]

#: onnx-ir `save`'s default: initializers up to this size stay inside the .onnx file.
EXTERNAL_SIZE_THRESHOLD = 256
#: Reuse the input's data file (copy it whole, keep offsets) when more than this share of it is still used.
REUSE_DATA_FILE_RATIO = 0.9
MAX_PROTOBUF_BYTES = 2**31 - 1
#: New initializers at least this big are serialized only as they are written (single-file save).
DEFER_SERIALIZATION_BYTES = 1 << 20


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
    if not fast_io.ENABLED or not _is_protobuf_path(path):
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
    if not fast_io.ENABLED or not _is_protobuf_path(path) or os.path.basename(data_name) != data_name:
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
