"""Does a written model load in onnxruntime? Checked before the model is put in place.

onnxruntime resolves a graph when it loads it: every node's type and shape inference
runs, contrib ops included (NhwcConv's, which onnx itself does not know). A model that
fails there is useless whatever graphopt's own checks say, so `save_model` runs this on
the staged file and refuses to commit a model onnxruntime would refuse.

Only the graph is loaded, not the weights: every initializer of more than a few KiB
becomes a graph input of the same type and shape (shape inference needs the values of
small constants such as Reshape targets, never those of weights). The one error
tolerated is a missing kernel (NOT_IMPLEMENTED): that comes after graph resolution, and
is expected for CUDA-only ops on a CPU-only build. Where the model graphopt was given
fails in the same way (a custom-domain op onnxruntime does not know, say), the output is
not held to more than its input. The session itself is made by
graphopt.ir.ort_graph_load. A graph onnxruntime loaded is remembered
(graphopt.ir.runtime_verdicts): the same bytes in the same onnxruntime are not checked
again, and onnxruntime is then not imported.
"""

from __future__ import annotations

import os
from pathlib import Path

import onnx

from graphopt.errors import ModelError
from graphopt.ir.ort_graph_load import error_text, load_error
from graphopt.ir.proto_checks import tensor_protos
from graphopt.ir.runtime_verdicts import known_to_load, onnxruntime_identity, remember_loads

__all__ = ["check_loads_in_onnxruntime", "runtime_load_error"]

#: Initializers larger than this are replaced by graph inputs for the check.
_KEEP_BYTES = 4096
#: Bigger single-file models are read through fast_io's skeleton (weights not parsed).
_PARSE_LIMIT = 64 << 20


def _has_external(proto: onnx.ModelProto) -> bool:
    """Whether any tensor (subgraph initializers, Constant attributes, function bodies included) is stored outside."""
    return any(t.data_location == onnx.TensorProto.EXTERNAL for t in tensor_protos(proto))


def _skeleton(path: Path) -> onnx.ModelProto:
    """The model at `path` without its weights: large or external initializers become graph inputs."""
    mapped = None
    if path.stat().st_size > _PARSE_LIMIT:  # fast_io is not imported for a small model
        from graphopt.ir import fast_io

        mapped = fast_io.map_model(path, min_file_bytes=_PARSE_LIMIT)
    proto = mapped.skeleton if mapped is not None else onnx.load(str(path), load_external_data=False)
    cut = set(mapped.entries) if mapped is not None else set()
    graph = proto.graph
    declared = {value.name for value in graph.input}
    kept = []
    for tensor in graph.initializer:
        heavy = tensor.name in cut or tensor.data_location == onnx.TensorProto.EXTERNAL or len(tensor.raw_data) > _KEEP_BYTES
        if not heavy:
            kept.append(tensor)
            continue
        if tensor.name not in declared:
            graph.input.append(onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims)))
    del graph.initializer[:]
    graph.initializer.extend(kept)
    return proto


def runtime_load_error(path: str | os.PathLike[str], *, may_write_beside: bool = False) -> str | None:
    """Why onnxruntime (CPU, optimizations off) refuses to load the graph at `path`, or None.

    Tensors stored outside that stay in the skeleton (in subgraphs, Constant nodes) are
    found relative to the model's folder, so the skeleton is then written beside it
    (`may_write_beside`: graphopt's own staging folder); where it may not be, the check
    cannot be made and says so ("cannot check ...")."""
    if onnxruntime_identity() is None and not _importable():
        return None
    path = Path(path)
    try:
        skeleton = _skeleton(path)
    except Exception as error:  # noqa: BLE001 - a model we cannot even read back
        return f"{type(error).__name__}: {error}" if _importable() else None
    graph: bytes | None = None
    try:
        if not _has_external(skeleton):
            graph = skeleton.SerializeToString()
    except Exception as error:  # noqa: BLE001 - as below
        return _words(error)
    if graph is not None and known_to_load(graph):  # these bytes loaded in this onnxruntime before (runtime_verdicts)
        return None
    if not _importable():  # imported here, as before any check (its own failures are not the model's)
        return None
    beside: Path | None = None
    try:
        if graph is None:
            if not may_write_beside:
                return "cannot check: tensors outside the main graph are stored externally"
            beside = path.with_name(f".{path.name}.graph-check.onnx")
            onnx.save(skeleton, str(beside))
            return _load_error(str(beside))
        problem = _load_error(graph)
    except Exception as error:  # noqa: BLE001 - writing the skeleton beside failed: as onnxruntime's own words
        return _words(error)
    finally:
        if beside is not None:
            beside.unlink(missing_ok=True)
    if problem is None:
        remember_loads(graph)
    return problem


def _words(error: BaseException) -> str | None:
    text = error_text(error)
    return None if "NOT_IMPLEMENTED" in text else text


def _importable() -> bool:
    """Whether onnxruntime imports (it is imported now if not yet): without it there is no check."""
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return False
    return True


def _load_error(model: bytes | str) -> str | None:
    """onnxruntime's refusal of the graph (None: it loads)."""
    import onnxruntime as ort

    return load_error(ort, model)


def check_loads_in_onnxruntime(path: str | os.PathLike[str], reference: str | os.PathLike[str] | None, what: str) -> None:
    """Raise ModelError if onnxruntime refuses the graph at `path` (in a staging folder
    graphopt owns) but not the one at `reference` (the input; None: no excuse)."""
    problem = runtime_load_error(path, may_write_beside=True)
    if problem is None:
        return
    if reference is not None and runtime_load_error(reference) is not None:
        return  # the input does not load either: nothing graphopt did
    raise ModelError(f"{what}: the optimized model does not load in onnxruntime ({problem}); nothing was written")
