"""Load and save ONNX models safely.

Loading goes through onnx-ir, which memory-maps external data instead of reading
it. Before anything else sees the model we check what would otherwise surface
as a crash deep inside a pass: a missing or non-ONNX file, an unsupported opset,
malformed tensors, attributes and names (`proto_checks`), a cycle, dangling value
names, and external-data references that are missing, not regular files,
truncated, or point outside the model's folder (never opened).

Saving is atomic: the model (and its external data, if any) is written into a
staging folder beside the destination (`.NAME.graphopt-PID-RANDOM`) and renamed
into place, so a crash or a full disk never leaves a half-written file at the output
path. A run killed before it finished leaves its staging folder behind; the next
save to the same path deletes it (`remove_stale_staging`). The data file never
replaces the one the model at the path reads (`_data_name`), so the path holds the
previous complete model or the new one at every moment, also when it is the input.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import onnx
import onnx_ir as ir
from google.protobuf.message import DecodeError

from graphopt.errors import ModelError
from graphopt.ir.proto_checks import MAX_MESSAGE_DEPTH_HINT, check_inference, check_proto_contents, tensor_protos
from graphopt.paths import short_name

__all__ = ["load_model", "save_model", "check_model", "remove_stale_staging", "data_file_names", "tensor_protos", "MAX_PROTOBUF_BYTES", "MIN_OPSET", "MIN_MAPPED_FILE_BYTES"]

MAX_PROTOBUF_BYTES = 2**31 - 1
EXTERNAL_DATA_META = "graphopt.input_had_external_data"
#: Oldest default-domain opset whose semantics the rules assume (BatchNormalization-7 onwards).
MIN_OPSET = 7
#: Single-file models from this size on are loaded through fast_io (weights memory-mapped, only a
#: skeleton parsed); smaller ones by onnx-ir's ordinary protobuf parse, without importing fast_io
#: or fast_save (with the wire format's module, ~3 ms of a small model's start-up).
MIN_MAPPED_FILE_BYTES = 32 << 20
#: Set on a model some of whose initializers fast_io memory-mapped: only then can fast_save reuse bytes.
MAPPED_META = "graphopt.fast_io_mapped"


def load_model(path: str | os.PathLike[str]) -> ir.Model:
    """Load `path` as an onnx-ir model; raise ModelError with a one-line reason if unusable."""
    path = Path(path)
    if not path.exists():
        raise ModelError(f"{path}: no such file")
    if path.is_dir():
        raise ModelError(f"{path}: is a directory, not an ONNX file")
    if path.stat().st_size == 0:
        raise ModelError(f"{path}: file is empty")
    try:
        # Big single-file models: weights memory-mapped, only a skeleton is parsed (fast_io.py).
        mapped = _map_big_model(path)
        proto = mapped.skeleton if mapped is not None else onnx.load(str(path), load_external_data=False)
    except (DecodeError, RuntimeError, ValueError, UnicodeDecodeError) as error:
        if "MaxDepth" in str(error) or "nested too deeply" in str(error).lower():
            raise ModelError(f"{path}: not a valid ONNX model: {MAX_MESSAGE_DEPTH_HINT}") from None
        raise ModelError(f"{path}: not a valid ONNX model (the protobuf does not parse: {_first_line(error)})") from None
    except OSError as error:
        raise ModelError(f"{path}: cannot read: {error.strerror or error}") from None
    _check_proto(proto, path)
    check_proto_contents(proto, str(path), frozenset(mapped.entries) if mapped is not None else frozenset())
    try:
        model = ir.serde.deserialize_model(proto)
        if mapped is not None:
            mapped.attach(model)
            model.meta[MAPPED_META] = True
    except Exception as error:  # onnx-ir rejects malformed content with assorted exceptions
        raise ModelError(f"{path}: malformed model: {_first_line(_root_cause(error))}") from None
    ir.external_data.set_base_dir(model.graph, str(path.parent))
    check_model(model, path)
    check_inference(proto, str(path))  # after the structural checks: their messages are more precise
    # Remembered so the output keeps the input's layout even if every external tensor was rewritten.
    model.meta[EXTERNAL_DATA_META] = _has_external(model)
    return model


def _map_big_model(path: Path) -> Any:
    """fast_io's skeleton of a big single-file model, or None (fast_io not imported for a small one)."""
    if path.stat().st_size < max(MIN_MAPPED_FILE_BYTES, 1):
        return None
    from graphopt.ir import fast_io

    return fast_io.map_model(path, min_file_bytes=MIN_MAPPED_FILE_BYTES)


def _root_cause(error: BaseException) -> BaseException:
    """onnx-ir wraps the real reason ("Output 'y' is redeclared ...") in a generic SerdeError."""
    while error.__cause__ is not None:
        error = error.__cause__
    return error


def _first_line(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0]


def _check_proto(proto: onnx.ModelProto, path: Path) -> None:
    if not proto.HasField("graph") or proto.ir_version <= 0:
        raise ModelError(f"{path}: not a valid ONNX model (no graph or no IR version)")
    opsets = {o.domain: o.version for o in proto.opset_import}
    default = opsets.get("", opsets.get("ai.onnx"))
    if default is None:
        raise ModelError(f"{path}: the model imports no default-domain opset")
    newest = onnx.defs.onnx_opset_version()
    if not MIN_OPSET <= default <= newest:
        raise ModelError(f"{path}: unsupported opset {default} (graphopt supports opsets {MIN_OPSET} to {newest})")


def check_model(model: ir.Model, path: Path | str = "<model>") -> None:
    """Structural checks on a loaded model: cycles, dangling names, external data."""
    base = Path(path).parent if str(path) != "<model>" else None
    _check_graph(model.graph, path, outer=set())
    for function in model.functions.values():
        _check_order(function, path, set(map(id, function.inputs)), f"function {function.name}")
    if base is not None:
        _check_external_data(model, base, path)


def _check_graph(graph: ir.Graph, path: Path | str, outer: set[int]) -> None:
    defined = set(outer)
    defined.update(map(id, graph.inputs))
    defined.update(map(id, graph.initializers.values()))
    _check_order(graph, path, defined, f"graph {graph.name or 'main'}")
    for node in graph:
        for attr in node.attributes.values():
            if attr.type == ir.AttributeType.GRAPH:
                _check_graph(attr.value, path, defined)
            elif attr.type == ir.AttributeType.GRAPHS:
                for sub in attr.value:
                    _check_graph(sub, path, defined)


def _check_order(graph: ir.Graph | ir.Function, path: Path | str, defined: set[int], what: str) -> None:
    """Every input must be defined before use: a graph input, an initializer, an outer
    value or an earlier node. If not, the graph has a cycle or a dangling name."""
    producers = {id(out): node for node in graph for out in node.outputs}
    for node in graph:
        for value in node.inputs:
            if value is None or id(value) in defined:
                continue
            producer = producers.get(id(value))
            name = value.name or "?"
            if producer is None:
                raise ModelError(f"{path}: {what}: node {node.name or node.op_type} uses '{name}', which nothing defines")
            if _reaches(producer, node, producers):
                raise ModelError(f"{path}: {what} has a cycle through '{name}' (node {node.name or node.op_type})")
            raise ModelError(f"{path}: {what} is not in topological order: '{name}' is used before node {producer.name or producer.op_type} defines it")
        defined.update(map(id, node.outputs))
    for value in graph.outputs:
        if id(value) not in defined:
            raise ModelError(f"{path}: {what}: output '{value.name}' is not defined by any node, input or initializer")


def _reaches(start: ir.Node, target: ir.Node, producers: dict[int, ir.Node]) -> bool:
    """Is `target` among the (transitive) producers of `start`'s inputs?"""
    stack, seen = [start], set()
    while stack:
        node = stack.pop()
        if node is target:
            return True
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.extend(producers[id(v)] for v in node.inputs if v is not None and id(v) in producers)
    return False


def _external_tensors(model: ir.Model) -> Iterator[tuple[str, ir.ExternalTensor]]:
    """Every tensor stored outside the model file: initializers, and tensor attributes
    (a Constant node's value) in any graph or function body."""
    for graph in model.graphs():
        for value in graph.initializers.values():
            if isinstance(value.const_value, ir.ExternalTensor):
                yield value.name or "?", value.const_value
    for scope in [*model.graphs(), *model.functions.values()]:
        for node in scope:
            for attr in node.attributes.values():
                tensors = [attr.value] if attr.type == ir.AttributeType.TENSOR else attr.value if attr.type == ir.AttributeType.TENSORS else []
                for tensor in tensors:
                    if isinstance(tensor, ir.ExternalTensor):
                        yield tensor.name or f"{node.name or node.op_type}.{attr.name}", tensor


def _check_external_data(model: ir.Model, base: Path, path: Path | str) -> None:
    real_base = os.path.realpath(base)
    sizes: dict[str, int] = {}
    for name, tensor in _external_tensors(model):
        location = tensor.location
        if os.path.isabs(location) or ".." in Path(location).parts:
            raise ModelError(f"{path}: tensor '{name}' points outside the model's folder: {location!r}")
        target = os.path.realpath(os.path.join(real_base, location))
        if os.path.commonpath([real_base, target]) != real_base:
            raise ModelError(f"{path}: tensor '{name}' points outside the model's folder via a link: {location!r}")
        if target not in sizes:
            if not os.path.exists(target):
                raise ModelError(f"{path}: external data file {location!r} of tensor '{name}' is missing")
            if not os.path.isfile(target):  # a folder, a FIFO, a device: never opened
                raise ModelError(f"{path}: external data file {location!r} of tensor '{name}' is not a regular file")
            if not os.access(target, os.R_OK):
                raise ModelError(f"{path}: external data file {location!r} is not readable")
            sizes[target] = os.path.getsize(target)
        end = (tensor.offset or 0) + (tensor.length if tensor.length is not None else tensor.nbytes)
        if end > sizes[target]:
            raise ModelError(f"{path}: external data for tensor '{name}' ends at byte {end}, past the end of {location!r} ({sizes[target]} bytes)")


def _has_external(model: ir.Model) -> bool:
    return any(isinstance(v.const_value, ir.ExternalTensor) for g in model.graphs() for v in g.initializers.values())


def _weight_bytes(model: ir.Model) -> int:
    return sum(v.const_value.nbytes for g in model.graphs() for v in g.initializers.values() if v.const_value is not None)


def _embed_attribute_tensors(model: ir.Model) -> None:
    """Read Constant-node tensors that live in external files into memory: onnx-ir's save
    moves only initializers, so their paths would stay relative to the input's folder."""
    for scope in [*model.graphs(), *model.functions.values()]:
        for node in scope:
            for name, attr in list(node.attributes.items()):
                if attr.type == ir.AttributeType.TENSOR and isinstance(attr.value, ir.ExternalTensor):
                    node.attributes[name] = ir.AttrTensor(name, ir.Tensor(attr.value.numpy(), name=attr.value.name))


def save_model(
    model: ir.Model,
    path: str | os.PathLike[str],
    *,
    external_data: bool | None = None,
    reference: str | os.PathLike[str] | None = None,
) -> None:
    """Write `model` to `path` atomically.

    Weights go to `<name>.data` beside it when `external_data` is True, or (None)
    when the input had external data or the model would not fit in one protobuf.
    See `_commit` for what a reader (or a crash) can see at `path`. Given the path of
    the model it was made from (`reference`), the staged model must load in onnxruntime
    (graph resolution, shape inference included) before it is put in place, unless the
    reference does not load either (graphopt.ir.runtime_check).
    """
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise ModelError(f"{path}: the output folder {folder} does not exist")
    _embed_attribute_tensors(model)
    if external_data is None:
        external_data = bool(model.meta.get(EXTERNAL_DATA_META)) or _has_external(model) or _weight_bytes(model) > MAX_PROTOBUF_BYTES - (64 << 20)
    data_name = _data_name(path) if external_data else None
    remove_stale_staging(path)
    try:
        staging = Path(tempfile.mkdtemp(prefix=f"{_staging_prefix(path)}{os.getpid()}-", dir=folder))
    except OSError as error:
        raise ModelError(f"{path}: cannot write to {folder}: {error.strerror or error}") from None
    staging_lock = None
    try:
        staging_lock = _lock(staging)  # held while we live: tells other runs this folder is in use
        staged = staging / path.name
        # fast_save reuses the input's bytes where it can (False: nothing written, use onnx-ir).
        if data_name:
            from graphopt.ir import fast_save

            if not fast_save.save_with_external_data(model, staged, data_name):
                ir.save(model, staged, external_data=data_name)
        elif not (model.meta.get(MAPPED_META) and _fast_save_single_file(model, staged)):
            ir.save(model, staged)
        if reference is not None:
            from graphopt.ir.runtime_check import check_loads_in_onnxruntime

            check_loads_in_onnxruntime(staged, reference, str(path))
        _commit(staging, path, data_name)
    except OSError as error:
        raise ModelError(f"{path}: cannot write the output: {error.strerror or error}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        _unlock(staging_lock)


def _fast_save_single_file(model: ir.Model, staged: Path) -> bool:
    """fast_save's single-file save, which copies the mapped initializers' bytes (False: nothing written)."""
    from graphopt.ir import fast_save

    return fast_save.save_single_file(model, staged)


# ------------------------------------------------------------------ atomic output


def _staging_prefix(path: Path) -> str:
    """Staging folders are `.NAME.graphopt-PID-RANDOM` beside the output NAME (a long
    NAME shortened: the folder's name must fit where NAME itself just fits)."""
    return f".{short_name(path.name)}.graphopt-"


def data_file_names(path: Path) -> tuple[str, str]:
    """The two names a model saved at `path` may give its external data file."""
    short = short_name(path.name)
    return f"{short}.data", f"{short}.alt.data"


def _data_name(path: Path) -> str:
    """`NAME.data`, or `NAME.alt.data` where the model now at `path` reads `NAME.data`.

    A model and its data file cannot be replaced together in one rename. Writing the
    new data under a name the current model does not read, then renaming the model
    over the old one, keeps `path` loadable at every moment: the previous model with
    its data, or the new one with its own (also for `-o IN --force`: IN is never lost)."""
    first, second = data_file_names(path)
    return second if first in {p.name for p in _own_data_files(path)} else first


def _own_data_files(path: Path) -> list[Path]:
    """The data files (of graphopt's two names) that the model now at `path` reads."""
    folder = path.parent if str(path.parent) else Path(".")
    names = data_file_names(path)
    if not any((folder / n).exists() for n in names) or not path.is_file():
        return []
    try:
        if path.stat().st_size > 64 << 20:  # a model with external data is small; a big one holds its weights
            return []
        proto = onnx.load(str(path), load_external_data=False)
    except Exception:  # not a model we can read: it reads nothing of ours that we know of
        return []
    used = {entry.value for tensor in tensor_protos(proto) for entry in tensor.external_data if entry.key == "location"}
    return [folder / n for n in names if n in used]


def _lock(folder: Path, blocking: bool = True) -> int | None:
    """An exclusive flock on `folder`; returns the descriptor (closing it releases the
    lock), or None where the file system has no such locks. The kernel drops the lock
    when its holder dies, SIGKILL included. Non-blocking: BlockingIOError when held."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None  # e.g. a folder we may write to but not list: go on without the lock
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
    except BlockingIOError:
        os.close(fd)
        raise
    except OSError as error:
        os.close(fd)
        if error.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            return None
        raise
    except BaseException:
        os.close(fd)
        raise
    return fd


def _unlock(fd: int | None) -> None:
    if fd is not None:
        os.close(fd)


def _commit(staging: Path, path: Path, data_name: str | None) -> None:
    """Move the staged output into place.

    One file: a single rename, so `path` is the previous file or the new one, never a
    mix. Two files: the data file first, under a name the previous model does not read
    (`_data_name`), then the model in one rename. A process killed between the steps
    leaves the previous model with its own data (and a data file nothing reads yet,
    replaced by the next run); after the model's rename, the new pair. Concurrent runs
    writing into one folder take turns (an flock on the folder), so two pairs never mix."""
    folder = path.parent if str(path.parent) else Path(".")
    lock = _lock(folder)
    try:
        replaced = _own_data_files(path)  # read under the lock: another run may have just committed
        if data_name:
            if data_name in {p.name for p in replaced}:
                # The current model reads the name we wrote under (a concurrent run took
                # the other name, or someone made a model read both): no mismatched pair
                # may be visible, so the model goes first, as before.
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
            os.replace(staging / data_name, folder / data_name)
        os.replace(staging / path.name, path)
        for old in replaced:  # the replaced model's data file: nothing reads it now
            if old.name != data_name:
                with contextlib.suppress(OSError):
                    old.unlink()
    finally:
        _unlock(lock)


def remove_stale_staging(path: str | os.PathLike[str]) -> list[Path]:
    """Delete staging folders that runs killed before they finished left beside `path`;
    returns them. A folder counts as stale when the process named in it is gone and
    nobody holds its lock (a live run holds it from creation to removal)."""
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    prefix = _staging_prefix(path)
    removed: list[Path] = []
    try:
        candidates = [p for p in folder.iterdir() if p.name.startswith(prefix) and p.is_dir() and not p.is_symlink()]
    except OSError:
        return removed
    for candidate in candidates:
        pid_text = candidate.name[len(prefix) :].split("-", 1)[0]
        if not pid_text.isdigit() or _process_alive(int(pid_text)):
            continue
        try:
            fd = _lock(candidate, blocking=False)
        except OSError:  # locked by a live run (another host, another pid namespace)
            continue
        try:
            shutil.rmtree(candidate, ignore_errors=True)
            removed.append(candidate)
        finally:
            _unlock(fd)
    return removed


def _process_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True
