"""Running a model in onnxruntime for verification, with onnxruntime's own graph rewrites off.

`_run` opens an InferenceSession on the model as written (big models, or ones whose
weights live in files, through a temporary folder with external data; a model newer
than this onnxruntime's IR version is run as the newest it supports) and runs it on
each set of inputs. A model onnxruntime refuses raises `_LoadFailed` with onnxruntime's
message cut to its first useful line (`_first_line`).
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

#: Models bigger than this go to onnxruntime through a temporary folder, not as bytes.
_MAX_INLINE_BYTES = 1 << 30

#: onnxruntime execution providers: names, or (name, options) pairs.
Providers = list[Any]


def _has_external(model: ir.Model) -> bool:
    return any(isinstance(v.const_value, ir.ExternalTensor) for g in model.graphs() for v in g.initializers.values())


def _weight_bytes(model: ir.Model) -> int:
    return sum(v.const_value.nbytes for g in model.graphs() for v in g.initializers.values() if v.const_value is not None)


class _LoadFailed(Exception):
    """onnxruntime refused the model itself (as opposed to failing on the inputs)."""


_MAX_IR = re.compile(r"max supported IR version: (\d+)")
_MISSING_KERNEL = re.compile(r"Could not find an implementation|NOT_IMPLEMENTED", re.IGNORECASE)


def _open_session(source: bytes | str, providers: Providers) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 4  # errors come back as exceptions; keep onnxruntime's log off stderr
    return ort.InferenceSession(source, options, providers=providers)


@contextmanager
def _embedded_attribute_tensors(model: ir.Model) -> Iterator[None]:
    """Constant-node tensors stored in external files, embedded for the duration: onnxruntime
    resolves such paths against its working folder, and onnx-ir's save moves only initializers."""
    swapped: list[tuple[ir.Node, str, ir.Attr]] = []
    try:
        for scope in [*model.graphs(), *model.functions.values()]:
            for node in scope:
                for name, attr in list(node.attributes.items()):
                    if attr.type == ir.AttributeType.TENSOR and isinstance(attr.value, ir.ExternalTensor):
                        swapped.append((node, name, attr))
                        node.attributes[name] = ir.AttrTensor(name, ir.Tensor(attr.value.numpy(), name=attr.value.name))
        yield
    finally:
        for node, name, attr in swapped:
            node.attributes[name] = attr


@contextmanager
def _session(model: ir.Model, providers: Providers) -> Iterator[Any]:
    """An InferenceSession for `model`, with onnxruntime's own graph rewrites off so the
    graph runs as written. Big models (or ones whose weights live in files) go through a
    temporary folder with external data, since a protobuf cannot exceed 2 GB.

    A model newer than this onnxruntime's IR version is run as the newest IR version it
    supports: both models get the same treatment, and what is compared is the graph."""
    with tempfile.TemporaryDirectory(prefix="graphopt-verify-") as folder, _embedded_attribute_tensors(model):
        if not _has_external(model) and _weight_bytes(model) < _MAX_INLINE_BYTES:
            proto = ir.serde.serialize_model(model)
            source: bytes | str = proto.SerializeToString()
        else:
            source = os.path.join(folder, "model.onnx")
            ir.save(model, source, external_data="model.onnx.data")
            proto = onnx.load(source, load_external_data=False)
        try:
            try:
                session = _open_session(source, providers)
            except Exception as error:  # noqa: BLE001 - onnxruntime raises its own types
                newest = _MAX_IR.search(str(error))
                if not newest or proto.ir_version <= int(newest.group(1)):
                    raise
                proto.ir_version = int(newest.group(1))
                if isinstance(source, bytes):
                    source = proto.SerializeToString()
                else:
                    onnx.save(proto, source)  # weights stay in model.onnx.data
                session = _open_session(source, providers)
        except Exception as error:  # noqa: BLE001
            raise _LoadFailed(_first_line(error)) from None
        yield session


def _run(model: ir.Model, feeds: list[dict[str, np.ndarray]], providers: Providers) -> list[dict[str, np.ndarray]]:
    with _session(model, providers) as session:
        names = [o.name for o in session.get_outputs()]
        wanted = {i.name for i in session.get_inputs()}
        results = []
        for feed in feeds:
            arrays = session.run(names, {k: v for k, v in feed.items() if k in wanted})
            results.append(dict(zip(names, arrays, strict=True)))
        return results


def _first_line(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    text = text.splitlines()[0]
    # onnxruntime prefixes messages with "[ONNXRuntimeError] : 1 : FAIL : " and often the C++
    # source location and function signature; keep the sentence after them.
    text = re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "", text)
    text = re.sub(r"\S+\.(?:cc|h|cpp):\d+ \S*?\(.*?\) ", "", text)
    return text[:400]
