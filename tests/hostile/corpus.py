"""A corpus of hostile inputs for `graphopt optimize`, built on the fly (no committed binaries).

Each `Case` writes its files into an empty folder and says what must happen:
`refused` (exit 2, one `error:` line naming the problem, nothing written) or
`optimized` (the input is odd but valid: exit 0 and an output that computes what the
input does). Some cases set traps: FIFOs outside the model's folder that a reference
points at. Opening a FIFO for reading blocks until someone writes to it, so a run
that reads outside the folder hangs and is caught by the time limit, instead of
quietly reading a file it must not.

Groups: the protobuf itself (truncated, wrong wire types, wrong field types), graph
structure (dangling names, duplicates, cycles, nesting depth, recursion), sizes
(huge declared dims and zip-bomb-like constants), external data (paths out of the
folder, links, FIFOs, offsets past the end, garbage fields), and pattern files
(syntax errors, unknown ops and helpers, recursion-heavy text, odd file kinds).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["Case", "Setup", "CASES", "TINY_INPUT"]

F = TensorProto.FLOAT
#: The one input of most models here, and a value for it.
TINY_INPUT = np.array([[1.5, -2.0, 0.25, 3.0]], np.float32)


@dataclass
class Setup:
    """What a case wrote: the model to optimize, extra command-line arguments, traps."""

    model: Path
    args: list[str] = field(default_factory=list)
    traps: list[Path] = field(default_factory=list)  #: FIFOs that must never be opened
    feeds: dict[str, np.ndarray] | None = None  #: for `optimized` cases: inputs to compare outputs on
    #: For `optimized` cases onnxruntime cannot run as given (it would materialize a huge
    #: tensor): the outputs the optimized model must give for `feeds`.
    expected: list[np.ndarray] | None = None


@dataclass(frozen=True)
class Case:
    name: str
    build: Callable[[Path], Setup]
    expect: str  #: "refused" or "optimized"
    needles: tuple[str, ...] = ()  #: words the error line must contain (case-insensitive)
    #: Not yet what it should be: why (the test is an expected failure until it is fixed).
    known_gap: str | None = None

    def __str__(self) -> str:
        return self.name


# ------------------------------------------------------------------ helpers


def _vi(name: str, shape: Sequence[int | str] | None = (1, 4), elem: int = F) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def _model(nodes, inputs=None, outputs=None, inits=(), opset: int = 17, functions=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "hostile", inputs if inputs is not None else [_vi("x")], outputs if outputs is not None else [_vi("y")], list(inits))
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(f.domain, 1) for f in functions]
    return helper.make_model(graph, opset_imports=opsets, ir_version=8, functions=list(functions))


def _relu_model() -> onnx.ModelProto:
    return _model([helper.make_node("Relu", ["x"], ["y"])])


def _write(folder: Path, model: onnx.ModelProto | bytes, name: str = "model.onnx") -> Path:
    """The bytes as they are: onnx.save would refuse (or fix) some of these models."""
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(model if isinstance(model, bytes) else model.SerializeToString())
    return path


def _varint(value: int) -> bytes:
    out = bytearray()
    value &= (1 << 64) - 1
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(number: int, wire_type: int, payload: bytes | int) -> bytes:
    key = _varint(number << 3 | wire_type)
    if wire_type == 0:
        assert isinstance(payload, int)
        return key + _varint(payload)
    assert isinstance(payload, bytes)
    return key + _varint(len(payload)) + payload


def _fifo(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)
    return path


def _external_add(location: str, offset: str | None = None, length: str | None = None, shape=(1, 4)) -> onnx.ModelProto:
    """y = x + w, w stored in `location` (offset/length written as given, even if not numbers)."""
    w = onnx.TensorProto(name="w", data_type=F, dims=list(shape))
    w.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", offset), ("length", length)):
        if value is not None:
            entry = w.external_data.add()
            entry.key, entry.value = key, value
    return _model([helper.make_node("Add", ["x", "w"], ["y"])], inits=[w])


def _in_folder(build: Callable[[Path], onnx.ModelProto | bytes]) -> Callable[[Path], Setup]:
    """A case whose model goes into `folder/model/`, so `..` means `folder/`."""

    def setup(folder: Path) -> Setup:
        return Setup(_write(folder / "model", build(folder)), feeds={"x": TINY_INPUT})

    return setup


# ------------------------------------------------------------------ the protobuf itself


def _truncated(fraction: float) -> Callable[[Path], Setup]:
    def setup(folder: Path) -> Setup:
        model = _model(
            [helper.make_node("Add", ["x", "w"], ["a"]), helper.make_node("Relu", ["a"], ["y"])],
            inits=[numpy_helper.from_array(np.arange(4, dtype=np.float32).reshape(1, 4), "w")],
        )
        data = model.SerializeToString()
        return Setup(_write(folder, data[: max(1, int(len(data) * fraction))]))

    return setup


def _graph_as_varint(folder: Path) -> Setup:
    """ModelProto.graph (field 7, a message) written as a number: protobuf keeps it as an unknown field."""
    head = _model([]).SerializeToString()
    proto = onnx.ModelProto()
    proto.ParseFromString(head)
    proto.ClearField("graph")
    return Setup(_write(folder, proto.SerializeToString() + _field(7, 0, 12345)))


def _ir_version_as_bytes(folder: Path) -> Setup:
    proto = _relu_model()
    proto.ClearField("ir_version")
    return Setup(_write(folder, _field(1, 2, b"eight") + proto.SerializeToString()))


def _opset_version_as_string(folder: Path) -> Setup:
    """OperatorSetIdProto.version (an int64) sent as a length-delimited field."""
    proto = _relu_model()
    proto.ClearField("opset_import")
    opset = _field(1, 2, b"") + _field(2, 2, b"17")
    return Setup(_write(folder, proto.SerializeToString() + _field(8, 2, opset)))


def _attribute_of_wrong_type(folder: Path) -> Setup:
    """Cast's `to` given as a string attribute."""
    node = helper.make_node("Cast", ["x"], ["y"])
    node.attribute.append(helper.make_attribute("to", "float"))
    return Setup(_write(folder, _model([node])))


def _attribute_type_field_lies(folder: Path) -> Setup:
    """An attribute whose declared type (INTS) does not match the field that holds it (a float)."""
    node = helper.make_node("Transpose", ["x"], ["y"])
    attr = node.attribute.add()
    attr.name, attr.type, attr.f = "perm", onnx.AttributeProto.INTS, 1.5
    return Setup(_write(folder, _model([node])))


def _raw_data_size_mismatch(folder: Path) -> Setup:
    w = onnx.TensorProto(name="w", data_type=F, dims=[1, 4], raw_data=b"\0" * 8)
    return Setup(_write(folder, _model([helper.make_node("Add", ["x", "w"], ["y"])], inits=[w])))


def _typed_data_of_wrong_kind(folder: Path) -> Setup:
    """A FLOAT tensor that carries int64_data (the wrong typed field) instead of float_data."""
    w = onnx.TensorProto(name="w", data_type=F, dims=[1, 4])
    w.int64_data.extend([1, 2, 3, 4])
    return Setup(_write(folder, _model([helper.make_node("Add", ["x", "w"], ["y"])], inits=[w])))


def _undefined_data_type(folder: Path) -> Setup:
    w = onnx.TensorProto(name="w", data_type=12345, dims=[1, 4], raw_data=b"\0" * 16)
    return Setup(_write(folder, _model([helper.make_node("Add", ["x", "w"], ["y"])], inits=[w])))


def _non_utf8_name(folder: Path) -> Setup:
    """A node input name that is not UTF-8 (protobuf strings must be)."""
    proto = _relu_model()
    data = proto.SerializeToString().replace(b"\x0a\x01x", b"\x0a\x01\xff", 1)  # NodeProto.input "x" -> "\xff"
    return Setup(_write(folder, data))


# ------------------------------------------------------------------ graph structure


def _dangling_input(folder: Path) -> Setup:
    return Setup(_write(folder, _model([helper.make_node("Add", ["x", "nowhere"], ["y"])])))


def _dangling_in_subgraph(folder: Path) -> Setup:
    branch = helper.make_graph([helper.make_node("Neg", ["ghost"], ["b"])], "branch", [], [_vi("b", None)])
    node = helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=branch)
    return Setup(_write(folder, _model([node], inputs=[_vi("c", [], TensorProto.BOOL)], outputs=[_vi("y", None)])))


def _output_defined_twice(folder: Path) -> Setup:
    return Setup(_write(folder, _model([helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Neg", ["x"], ["y"])])))


def _duplicate_initializers(folder: Path) -> Setup:
    a = numpy_helper.from_array(np.ones((1, 4), np.float32), "w")
    b = numpy_helper.from_array(np.zeros((1, 4), np.float32), "w")
    return Setup(_write(folder, _model([helper.make_node("Add", ["x", "w"], ["y"])], inits=[a, b])))


def _duplicate_graph_inputs(folder: Path) -> Setup:
    return Setup(_write(folder, _model([helper.make_node("Add", ["x", "x"], ["y"])], inputs=[_vi("x"), _vi("x")])))


def _subgraph_shadows_outer_name(folder: Path) -> Setup:
    """A branch defines `x`, a name the main graph already has (SSA across scopes forbids it)."""
    branch = helper.make_graph([helper.make_node("Neg", ["y0"], ["x"])], "branch", [], [_vi("x", None)])
    nodes = [helper.make_node("Relu", ["x"], ["y0"]), helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=branch)]
    return Setup(_write(folder, _model(nodes, inputs=[_vi("x"), _vi("c", [], TensorProto.BOOL)], outputs=[_vi("y", None)])))


def _input_with_initializer_default(folder: Path) -> Setup:
    """Valid (IR >= 4): an input that also has an initializer is an input with a default value."""
    w = numpy_helper.from_array(np.full((1, 4), 2.0, np.float32), "w")
    model = _model([helper.make_node("Mul", ["x", "w"], ["y"])], inputs=[_vi("x"), _vi("w")], inits=[w])
    return Setup(_write(folder, model), feeds={"x": TINY_INPUT, "w": np.full((1, 4), 3.0, np.float32)})


def _duplicate_node_names(folder: Path) -> Setup:
    """ONNX calls node names optional; onnxruntime refuses two non-empty equal ones."""
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="same"), helper.make_node("Neg", ["a"], ["y"], name="same")]
    return Setup(_write(folder, _model(nodes)))


def _unnamed_nodes(folder: Path) -> Setup:
    """Valid: empty node names, any number of them."""
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["a"], ["b"]), helper.make_node("Abs", ["b"], ["y"])]
    return Setup(_write(folder, _model(nodes)), feeds={"x": TINY_INPUT})


def _cycle(folder: Path) -> Setup:
    nodes = [helper.make_node("Add", ["x", "b"], ["a"]), helper.make_node("Relu", ["a"], ["b"]), helper.make_node("Relu", ["b"], ["y"])]
    return Setup(_write(folder, _model(nodes)))


def _self_loop(folder: Path) -> Setup:
    return Setup(_write(folder, _model([helper.make_node("Add", ["x", "y"], ["y"])])))


def _cycle_in_subgraph(folder: Path) -> Setup:
    branch = helper.make_graph(
        [helper.make_node("Add", ["x", "q"], ["p"]), helper.make_node("Neg", ["p"], ["q"])], "branch", [], [_vi("q", None)]
    )
    node = helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=branch)
    return Setup(_write(folder, _model([node], inputs=[_vi("x"), _vi("c", [], TensorProto.BOOL)], outputs=[_vi("y", None)])))


def _nested_ifs(depth: int) -> Callable[[Path], Setup]:
    """If inside If inside If ... `depth` levels deep (then-branches nest; else-branches are
    flat). Written by hand: protobuf's own builders stop at 100 message levels (3 per If)."""

    def setup(folder: Path) -> Setup:
        vi = lambda name: _vi(name, (1, 4)).SerializeToString()  # noqa: E731

        def graph(nodes: list[bytes], name: str, output: str) -> bytes:
            return b"".join(_field(1, 2, n) for n in nodes) + _field(2, 2, name.encode()) + _field(12, 2, vi(output))

        def if_node(output: str, then_graph: bytes, else_graph: bytes) -> bytes:
            attrs = [_field(1, 2, name.encode()) + _field(6, 2, g) + _field(20, 0, onnx.AttributeProto.GRAPH) for name, g in (("then_branch", then_graph), ("else_branch", else_graph))]
            return _field(1, 2, b"c") + _field(2, 2, output.encode()) + _field(4, 2, b"If") + b"".join(_field(5, 2, a) for a in attrs)

        inner = graph([helper.make_node("Neg", ["x"], [f"v{depth}"]).SerializeToString()], f"g{depth}", f"v{depth}")
        for level in range(depth - 1, 0, -1):
            flat = graph([helper.make_node("Abs", ["x"], [f"e{level}"]).SerializeToString()], f"e{level}", f"e{level}")
            inner = graph([if_node(f"v{level}", inner, flat)], f"g{level}", f"v{level}")
        flat = graph([helper.make_node("Abs", ["x"], ["e0"]).SerializeToString()], "e0", "e0")
        shell = _model([], inputs=[_vi("x"), _vi("c", [], TensorProto.BOOL)]).SerializeToString()
        head = onnx.ModelProto()
        head.ParseFromString(shell)
        main = head.graph.SerializeToString() + _field(1, 2, if_node("y", inner, flat))
        head.ClearField("graph")
        return Setup(_write(folder, head.SerializeToString() + _field(7, 2, main)), feeds={"x": TINY_INPUT, "c": np.array(True)})

    return setup


def _recursive_function(folder: Path) -> Setup:
    """A model-local function that calls itself (ONNX forbids recursion; expanding it never ends)."""
    function = helper.make_function("local", "Loopy", ["X"], ["Y"], [helper.make_node("Loopy", ["X"], ["Y"], domain="local")], [helper.make_opsetid("", 17), helper.make_opsetid("local", 1)])
    return Setup(_write(folder, _model([helper.make_node("Loopy", ["x"], ["y"], domain="local")], functions=[function])))


def _mutually_recursive_functions(folder: Path) -> Setup:
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("local", 1)]
    ping = helper.make_function("local", "Ping", ["X"], ["Y"], [helper.make_node("Pong", ["X"], ["Y"], domain="local")], opsets)
    pong = helper.make_function("local", "Pong", ["X"], ["Y"], [helper.make_node("Ping", ["X"], ["Y"], domain="local")], opsets)
    model = _model([helper.make_node("Ping", ["x"], ["y"], domain="local")], functions=[ping])
    model.functions.append(pong)
    return Setup(_write(folder, model))


def _unknown_default_domain_op(folder: Path) -> Setup:
    return Setup(_write(folder, _model([helper.make_node("NoSuchOperator", ["x"], ["y"])])))


def _no_nodes_output_is_input(folder: Path) -> Setup:
    """Valid: a graph whose output is its input."""
    model = _model([], inputs=[_vi("x")], outputs=[_vi("x")])
    return Setup(_write(folder, model), feeds={"x": TINY_INPUT})


# ------------------------------------------------------------------ sizes


def _huge_input_dims(folder: Path) -> Setup:
    """Valid: a declared input shape of 2^62 x 4 is only a declaration; nothing may be allocated from it."""
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["a"], ["y"])]
    model = _model(nodes, inputs=[_vi("x", (2**62, 4))], outputs=[_vi("y", (2**62, 4))])
    return Setup(_write(folder, model))  # no feeds: onnxruntime cannot make such an input either


def _huge_initializer_without_data(folder: Path) -> Setup:
    w = onnx.TensorProto(name="w", data_type=F, dims=[2**31, 2**31])  # 2^64 bytes declared, none present
    return Setup(_write(folder, _model([helper.make_node("Add", ["x", "w"], ["y"])], inits=[w])))


def _negative_dims(folder: Path) -> Setup:
    w = onnx.TensorProto(name="w", data_type=F, dims=[-1, 4], raw_data=b"")
    return Setup(_write(folder, _model([helper.make_node("Add", ["x", "w"], ["y"])], inits=[w])))


def _constant_bomb(folder: Path) -> Setup:
    """A Constant node whose tensor declares 2^62 elements and holds none."""
    value = onnx.TensorProto(name="c", data_type=F, dims=[2**31, 2**31])
    nodes = [helper.make_node("Constant", [], ["c"], value=value), helper.make_node("Add", ["x", "c"], ["y"])]
    return Setup(_write(folder, _model(nodes)))


def _constant_of_shape_bomb(folder: Path) -> Setup:
    """Valid: ConstantOfShape([2^40]) of constants: constant folding must not materialize 4 TB.
    The output is only used through Shape, so the model itself is fine."""
    shape = numpy_helper.from_array(np.array([2**20, 2**20], np.int64), "shape")
    nodes = [
        helper.make_node("ConstantOfShape", ["shape"], ["big"], value=numpy_helper.from_array(np.array([1.0], np.float32))),
        helper.make_node("Expand", ["big", "shape"], ["bigger"]),
        helper.make_node("Shape", ["bigger"], ["s"]),
        helper.make_node("Cast", ["s"], ["sf"], to=F),
        helper.make_node("ReduceSum", ["sf"], ["total"], keepdims=0),
        helper.make_node("Add", ["x", "total"], ["y"]),
    ]
    # onnxruntime would materialize the 2^40 floats; the optimized model must not need to.
    return Setup(_write(folder, _model(nodes, inits=[shape])), feeds={"x": TINY_INPUT}, expected=[TINY_INPUT + 2.0**21])


def _tile_bomb(folder: Path) -> Setup:
    """Valid: Tile of a constant by 2^20 x 2^20, then a Slice back to 1 x 4: folding must refuse the big middle."""
    base = numpy_helper.from_array(np.arange(4, dtype=np.float32).reshape(1, 4), "base")
    repeats = numpy_helper.from_array(np.array([2**20, 2**20], np.int64), "repeats")
    starts, ends = (numpy_helper.from_array(np.array(v, np.int64), n) for n, v in (("starts", [0, 0]), ("ends", [1, 4])))
    nodes = [
        helper.make_node("Tile", ["base", "repeats"], ["tiled"]),
        helper.make_node("Slice", ["tiled", "starts", "ends"], ["piece"]),
        helper.make_node("Add", ["x", "piece"], ["y"]),
    ]
    return Setup(_write(folder, _model(nodes, inits=[base, repeats, starts, ends])))  # no feeds: the middle is 16 TB


# ------------------------------------------------------------------ external data


def _outside(kind: str) -> Callable[[Path], Setup]:
    """A tensor stored outside the model's folder: `..`, an absolute path, or a link out.
    The target is a FIFO: opening it would hang the run."""

    def setup(folder: Path) -> Setup:
        trap = _fifo(folder / "secret.bin")
        model_folder = folder / "model"
        model_folder.mkdir()
        if kind == "dotdot":
            location = "../secret.bin"
        elif kind == "dotdot-inside":
            (model_folder / "sub").mkdir()
            location = "sub/../../secret.bin"
        elif kind == "absolute":
            location = str(trap)
        elif kind == "symlink":
            (model_folder / "link.bin").symlink_to(trap)
            location = "link.bin"
        elif kind == "symlinked-folder":
            (model_folder / "weights").symlink_to(folder, target_is_directory=True)
            location = "weights/secret.bin"
        else:
            raise ValueError(kind)
        return Setup(_write(model_folder, _external_add(location)), traps=[trap])

    return setup


def _fifo_inside(folder: Path) -> Setup:
    """The data "file" is a FIFO inside the folder: not a regular file, never opened."""
    trap = _fifo(folder / "weights.bin")
    return Setup(_write(folder, _external_add("weights.bin")), traps=[trap])


def _data_is_a_directory(folder: Path) -> Setup:
    (folder / "weights.bin").mkdir(parents=True)
    return Setup(_write(folder, _external_add("weights.bin")))


def _offset_past_end(folder: Path) -> Setup:
    (folder / "weights.bin").parent.mkdir(parents=True, exist_ok=True)
    (folder / "weights.bin").write_bytes(b"\0" * 16)
    return Setup(_write(folder, _external_add("weights.bin", offset="4096")))


def _length_past_end(folder: Path) -> Setup:
    """A 4 GiB tensor (shape and length agree) in a 16-byte file: refused, never read or allocated."""
    (folder / "weights.bin").parent.mkdir(parents=True, exist_ok=True)
    (folder / "weights.bin").write_bytes(b"\0" * 16)
    return Setup(_write(folder, _external_add("weights.bin", offset="0", length=str(2**32), shape=(1, 2**30))))


def _garbage_offset(value: str) -> Callable[[Path], Setup]:
    def setup(folder: Path) -> Setup:
        (folder / "weights.bin").parent.mkdir(parents=True, exist_ok=True)
        (folder / "weights.bin").write_bytes(b"\0" * 16)
        return Setup(_write(folder, _external_add("weights.bin", offset=value)))

    return setup


def _empty_location(folder: Path) -> Setup:
    return Setup(_write(folder, _external_add("")))


def _location_with_nul(folder: Path) -> Setup:
    return Setup(_write(folder, _external_add("weights.bin\0/../../etc/passwd")))


def _location_is_the_model_itself(folder: Path) -> Setup:
    """The tensor's bytes are read from model.onnx itself: odd but inside the folder. The
    model file is only a few hundred bytes, so offset 0, 16 bytes is within it: valid."""
    return Setup(_write(folder, _external_add("model.onnx", offset="0", length="16")), feeds={"x": TINY_INPUT})


def _external_length_disagrees_with_shape(folder: Path) -> Setup:
    (folder / "weights.bin").parent.mkdir(parents=True, exist_ok=True)
    (folder / "weights.bin").write_bytes(b"\0" * 64)
    return Setup(_write(folder, _external_add("weights.bin", offset="0", length="8")))


# ------------------------------------------------------------------ pattern files


def _with_patterns(text: str | bytes, name: str = "rules.pdll", kind: str = "file") -> Callable[[Path], Setup]:
    """A valid small model and a pattern file (or folder) holding `text`."""

    def setup(folder: Path) -> Setup:
        model = _write(folder, _model([helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Relu", ["a"], ["y"])]))
        patterns = folder / "patterns"
        patterns.mkdir()
        path = patterns / name
        traps: list[Path] = []
        if kind == "fifo":
            traps.append(_fifo(path))
        elif kind == "dir":
            path.mkdir()
        elif kind == "symlink-loop":
            path.symlink_to(path)
        else:
            path.write_bytes(text.encode() if isinstance(text, str) else text)
        target = patterns if kind != "file-direct" else path
        return Setup(model, args=["--patterns", str(target)], traps=traps, feeds={"x": TINY_INPUT})

    return setup


_DEEP = 5000
CASES: list[Case] = [
    # the protobuf itself
    Case("truncated-1-byte", _truncated(0.0), "refused", ("not a valid ONNX model",)),
    Case("truncated-half", _truncated(0.5), "refused", ("model.onnx",)),
    Case("truncated-last-byte", _truncated(0.99), "refused", ("model.onnx",)),
    Case("graph-field-as-number", _graph_as_varint, "refused", ("no graph",)),
    Case("ir-version-as-bytes", _ir_version_as_bytes, "refused", ("IR version",)),
    Case("opset-version-as-string", _opset_version_as_string, "refused", ("opset",)),
    Case("attribute-of-wrong-type", _attribute_of_wrong_type, "refused", ("to",)),
    Case("attribute-type-field-lies", _attribute_type_field_lies, "refused", ("perm",)),
    Case("raw-data-size-mismatch", _raw_data_size_mismatch, "refused", ("'w'",)),
    Case("typed-data-of-wrong-kind", _typed_data_of_wrong_kind, "refused", ("'w'",)),
    Case("undefined-data-type", _undefined_data_type, "refused", ("12345",)),
    Case("non-utf8-name", _non_utf8_name, "refused", ("model.onnx",)),
    # graph structure
    Case("dangling-input", _dangling_input, "refused", ("nowhere",)),
    Case("dangling-in-subgraph", _dangling_in_subgraph, "refused", ("ghost",)),
    Case("output-defined-twice", _output_defined_twice, "refused", ("'y'",)),
    Case("duplicate-initializers", _duplicate_initializers, "refused", ("'w'",)),
    Case("duplicate-graph-inputs", _duplicate_graph_inputs, "refused", ("'x'",)),
    Case("subgraph-shadows-outer-name", _subgraph_shadows_outer_name, "refused", ("'x'",)),
    Case("input-with-initializer-default", _input_with_initializer_default, "optimized"),
    Case("duplicate-node-names", _duplicate_node_names, "refused", ("same",)),
    Case("unnamed-nodes", _unnamed_nodes, "optimized"),
    Case("cycle", _cycle, "refused", ("cycle",)),
    Case("self-loop", _self_loop, "refused", ("cycle",)),
    Case("cycle-in-subgraph", _cycle_in_subgraph, "refused", ("cycle",)),
    Case("nested-ifs-25", _nested_ifs(25), "optimized"),
    Case("nested-ifs-400", _nested_ifs(400), "refused", ("nested",)),
    Case("recursive-function", _recursive_function, "refused", ("Loopy", "recursive")),
    Case("mutually-recursive-functions", _mutually_recursive_functions, "refused", ("recursive",)),
    Case("unknown-default-domain-op", _unknown_default_domain_op, "refused", ("NoSuchOperator",)),
    Case("no-nodes-output-is-input", _no_nodes_output_is_input, "optimized"),
    # sizes
    Case("huge-input-dims", _huge_input_dims, "optimized"),
    Case("huge-initializer-without-data", _huge_initializer_without_data, "refused", ("'w'",)),
    Case("negative-dims", _negative_dims, "refused", ("'w'",)),
    Case("constant-bomb", _constant_bomb, "refused", ("Constant",)),
    Case("constant-of-shape-bomb", _constant_of_shape_bomb, "optimized"),
    Case("tile-bomb", _tile_bomb, "optimized"),
    # external data
    Case("external-dotdot", _outside("dotdot"), "refused", ("outside the model's folder",)),
    Case("external-dotdot-inside-path", _outside("dotdot-inside"), "refused", ("outside the model's folder",)),
    Case("external-absolute", _outside("absolute"), "refused", ("outside the model's folder",)),
    Case("external-symlink-out", _outside("symlink"), "refused", ("outside the model's folder",)),
    Case("external-symlinked-folder-out", _outside("symlinked-folder"), "refused", ("outside the model's folder",)),
    Case("external-fifo-inside", _fifo_inside, "refused", ("weights.bin",)),
    Case("external-data-is-a-directory", _data_is_a_directory, "refused", ("weights.bin",)),
    Case("external-offset-past-end", _offset_past_end, "refused", ("past the end",)),
    Case("external-length-past-end", _length_past_end, "refused", ("past the end",)),
    Case("external-offset-not-a-number", _garbage_offset("lots"), "refused", ("offset",)),
    Case("external-offset-negative", _garbage_offset("-64"), "refused", ("offset",)),
    Case("external-empty-location", _empty_location, "refused", ("'w'",)),
    Case("external-location-with-nul", _location_with_nul, "refused", ("'w'",)),
    Case("external-location-is-the-model", _location_is_the_model_itself, "optimized"),
    Case("external-length-disagrees-with-shape", _external_length_disagrees_with_shape, "refused", ("'w'",)),
    # pattern files
    Case("pattern-syntax-error", _with_patterns("Pattern Broken {\n  let r = op<Relu>(x;\n}\n"), "refused", ("rules.pdll:2:",)),
    Case("pattern-unterminated", _with_patterns("Pattern Open {\n  let r = op<Relu>(x);\n"), "refused", ("rules.pdll:",)),
    Case("pattern-binary-garbage", _with_patterns(bytes(range(256)) * 4), "refused", ("rules.pdll",)),
    Case("pattern-not-utf8", _with_patterns(b"// caf\xe9\nPattern P { let r = op<Relu>(x); replace r with x; }\n"), "refused", ("rules.pdll",)),
    Case(
        "pattern-unknown-op",
        _with_patterns("Pattern Ghost {\n  let r = op<NoSuchOperator>(x);\n  replace r with x;\n}\n"),
        "refused",
        ("NoSuchOperator", "does not define"),
    ),
    Case("pattern-unknown-native", _with_patterns("Constraint Nowhere(x);\nPattern P {\n  let r = op<Relu>(x);\n  Nowhere(x);\n  replace r with x;\n}\n"), "refused", ("Nowhere", "no Python implementation")),
    Case("pattern-undeclared-native-call", _with_patterns("Pattern P {\n  let r = op<Relu>(x);\n  rewrite r with {\n    let k = Conjure(x);\n    replace r with k.v;\n  };\n}\n"), "refused", ("Conjure",)),
    Case("pattern-deep-nesting", _with_patterns("Pattern Deep {\n  let r = " + "op<Relu>(" * _DEEP + "x" + ")" * _DEEP + ";\n  replace r with x;\n}\n"), "refused", ("rules.pdll",)),
    Case("pattern-deep-alternatives", _with_patterns("Pattern Alts {\n  let r = " + "".join(f"alt a{i} {{ p: " for i in range(2000)) + "op<Relu>(x)" + " }" * 2000 + ";\n  replace r with x;\n}\n"), "refused", ("rules.pdll",)),
    Case("pattern-deep-list", _with_patterns("Pattern P {\n  let r = op<Relu>(x) {a = " + "[" * 50000 + "1" + "]" * 50000 + "};\n  replace r with x;\n}\n"), "refused", ("rules.pdll",)),
    Case("pattern-long-line", _with_patterns("// " + "x" * 5_000_000 + "\n"), "optimized"),
    Case("pattern-empty-file", _with_patterns(""), "optimized"),
    Case("pattern-python-syntax-error", _with_patterns("def broken(:\n", name="helpers.py"), "refused", ("helpers.py:1:",)),
    Case("pattern-python-raises", _with_patterns("raise RuntimeError('no')\n", name="helpers.py"), "refused", ("helpers.py:1:", "no")),
    Case("pattern-python-deep-recursion", _with_patterns("def f(n):\n    return f(n + 1)\nf(0)\n", name="helpers.py"), "refused", ("helpers.py",)),
    Case("pattern-fifo-in-folder", _with_patterns("", kind="fifo"), "optimized"),
    Case("pattern-folder-named-pdll", _with_patterns("", kind="dir"), "optimized"),
    Case("pattern-symlink-loop", _with_patterns("", kind="symlink-loop"), "optimized"),
]


# ------------------------------------------------------------------ issue 16: tracebacks, lies and invalid models


def _non_utf8_op_type(folder: Path) -> Setup:
    """NodeProto.op_type "Relu" -> "Rel\\xff" (was a TypeError in onnx.defs.has_schema)."""
    data = _relu_model().SerializeToString().replace(b"Relu", b"Rel\xff", 1)
    return Setup(_write(folder, data))


def _non_utf8_graph_name(folder: Path) -> Setup:
    """GraphProto.name "hostile" -> "hostil\\xff" (was a SerdeError traceback)."""
    data = _relu_model().SerializeToString().replace(b"hostile", b"hostil\xff", 1)
    return Setup(_write(folder, data))


def _undefined_attribute(folder: Path) -> Setup:
    """An attribute of type UNDEFINED (0) with no value."""
    node = helper.make_node("LeakyRelu", ["x"], ["y"])
    attr = node.attribute.add()
    attr.name = "alpha"
    return Setup(_write(folder, _model([node])))


def _cast_without_to(folder: Path) -> Setup:
    return Setup(_write(folder, _model([helper.make_node("Cast", ["x"], ["y"])])))


def _cast_to_unknown_type(on_constant: bool) -> Callable[[Path], Setup]:
    def setup(folder: Path) -> Setup:
        source = "c" if on_constant else "x"
        nodes = [helper.make_node("Cast", [source], ["cast"], to=999), helper.make_node("Add", ["x", "cast"], ["y"])]
        inits = [numpy_helper.from_array(np.ones((1, 4), np.float32), "c")] if on_constant else []
        return Setup(_write(folder, _model(nodes, inits=inits)))

    return setup


def _external_length_of_digits(key: str) -> Callable[[Path], Setup]:
    """An external-data offset or length of 5000 digits (a number no file reaches)."""

    def setup(folder: Path) -> Setup:
        (folder / "weights.bin").parent.mkdir(parents=True, exist_ok=True)
        (folder / "weights.bin").write_bytes(b"\0" * 16)
        digits = "9" * 5000
        kwargs = {"offset": digits} if key == "offset" else {"length": digits}
        return Setup(_write(folder, _external_add("weights.bin", **kwargs)))

    return setup


def _pad_axes_mismatch(folder: Path) -> Setup:
    """Pad (opset 18, axes input) whose axes has 1 entry for 4 pads, feeding a Conv (the Pad+Conv helper)."""
    x = _vi("x", (1, 1, 4, 4))
    w = numpy_helper.from_array(np.ones((1, 1, 1, 1), np.float32), "w")
    pads = numpy_helper.from_array(np.array([1, 1, 1, 1], np.int64), "pads")
    axes = numpy_helper.from_array(np.array([2], np.int64), "axes")
    nodes = [helper.make_node("Pad", ["x", "pads", "", "axes"], ["p"]), helper.make_node("Conv", ["p", "w"], ["y"])]
    return Setup(_write(folder, _model(nodes, inputs=[x], outputs=[_vi("y", None)], inits=[w, pads, axes], opset=18)))


def _slice_step_zero(folder: Path) -> Setup:
    starts, ends, axes, steps = (numpy_helper.from_array(np.array([v], np.int64), n) for n, v in (("s", 0), ("e", 4), ("a", 1), ("st", 0)))
    nodes = [helper.make_node("Slice", ["x", "s", "e", "a", "st"], ["y"])]
    return Setup(_write(folder, _model(nodes, outputs=[_vi("y", None)], inits=[starts, ends, axes, steps])))


def _lying_value_info(op: str) -> Callable[[Path], Setup]:
    """value_info says [1, 1] over a 100000 x 100000 constant: 37 GiB if the folder believed the data."""

    def setup(folder: Path) -> Setup:
        shape = numpy_helper.from_array(np.array([100000, 100000], np.int64), "shape")
        one = numpy_helper.from_array(np.ones((1, 1), np.float32), "one")
        if op == "ConstantOfShape":
            make = helper.make_node("ConstantOfShape", ["shape"], ["big"], value=numpy_helper.from_array(np.array([1.0], np.float32)))
        elif op == "Expand":
            make = helper.make_node("Expand", ["one", "shape"], ["big"])
        else:
            make = helper.make_node("Tile", ["one", "shape"], ["big"])
        nodes = [make, helper.make_node("ReduceSum", ["big"], ["total"], keepdims=0), helper.make_node("Add", ["x", "total"], ["y"])]
        model = _model(nodes, inits=[shape, one])
        model.graph.value_info.append(_vi("big", (1, 1)))
        return Setup(_write(folder, model))  # no feeds: onnxruntime would allocate the 37 GiB

    return setup


def _loop_model(body_inputs: int, with_condition: bool, with_body: bool = True) -> Callable[[Path], Setup]:
    def setup(folder: Path) -> Setup:
        body_in = [_vi("i", [], TensorProto.INT64), _vi("cond_in", [], TensorProto.BOOL), _vi("acc", (1, 4))][: body_inputs]
        nodes = [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Relu", ["x"], ["acc_out"])]
        outputs = ([_vi("cond_out", [], TensorProto.BOOL)] if with_condition else []) + [_vi("acc_out", (1, 4))]
        body = helper.make_graph(nodes if with_condition else nodes[1:], "body", body_in, outputs)
        trip = numpy_helper.from_array(np.array(2, np.int64), "trip")
        loop = helper.make_node("Loop", ["trip", "", "x"], ["y"], **({"body": body} if with_body else {}))
        return Setup(_write(folder, _model([loop], inits=[trip])))

    return setup


def _control_characters_in_names(folder: Path) -> Setup:
    """A node name holding terminal escapes, in a model graphopt refuses (the name reaches the error line)."""
    node = helper.make_node("Add", ["x", "nowhere"], ["y"], name="evil\x1b[2J\x1b]0;pwned\x07")
    return Setup(_write(folder, _model([node])))


def _segment_bomb(folder: Path) -> Setup:
    """A 90-byte model: an initializer with the `segment` field declaring 2^22 floats and holding none."""
    w = onnx.TensorProto(name="w", data_type=F, dims=[1, 2**22])
    w.segment.begin, w.segment.end = 0, 2**22
    return Setup(_write(folder, _model([helper.make_node("Neg", ["w"], ["n"]), helper.make_node("ReduceSum", ["n"], ["s"], keepdims=0),
                                        helper.make_node("Add", ["x", "s"], ["y"])], inits=[w])))


CASES += [
    Case("non-utf8-op-type", _non_utf8_op_type, "refused", ("UTF-8",)),
    Case("non-utf8-graph-name", _non_utf8_graph_name, "refused", ("UTF-8",)),
    Case("attribute-undefined-type", _undefined_attribute, "refused", ("alpha", "UNDEFINED")),
    Case("cast-without-to", _cast_without_to, "refused", ("to",)),
    Case("cast-to-unknown-type-on-input", _cast_to_unknown_type(False), "refused", ("999",)),
    Case("cast-to-unknown-type-on-constant", _cast_to_unknown_type(True), "refused", ("999",)),
    Case("external-length-5000-digits", _external_length_of_digits("length"), "refused", ("'w'",)),
    Case("external-offset-5000-digits", _external_length_of_digits("offset"), "refused", ("'w'",)),
    Case("pad-axes-length-mismatch", _pad_axes_mismatch, "refused", ("Pads",)),
    Case("slice-step-zero", _slice_step_zero, "refused", ("step",)),
    Case("value-info-lies-constant-of-shape", _lying_value_info("ConstantOfShape"), "refused", ("differ",)),
    Case("value-info-lies-expand", _lying_value_info("Expand"), "refused", ("differ",)),
    Case("value-info-lies-tile", _lying_value_info("Tile"), "refused", ("differ",)),
    Case("loop-body-with-one-input", _loop_model(1, True), "refused", ("body",)),
    Case("loop-body-without-condition-output", _loop_model(3, False), "refused", ("body",)),
    Case("loop-without-body", _loop_model(3, True, with_body=False), "refused", ("body",)),
    Case("control-characters-in-names", _control_characters_in_names, "refused", ("evil\\x1b[2J",)),
    Case("segment-bomb", _segment_bomb, "refused", ("segment",)),
]


def _verify_with(shape: Sequence[int | str], *args: str) -> Callable[[Path], Setup]:
    """Relu(x) with x declared `shape`, optimized with --verify (and `args`)."""

    def setup(folder: Path) -> Setup:
        model = _model([helper.make_node("Relu", ["x"], ["y"])], inputs=[_vi("x", shape)], outputs=[_vi("y", shape)])
        return Setup(_write(folder, model), args=["--verify", *args])

    return setup


CASES += [
    Case("verify-input-shape-huge", _verify_with(("n", 8), "--input-shape", "x=100000000000,8"), "refused", ("GiB", "--input-shape")),
    Case("verify-declared-negative-dim", _verify_with((-3, 4)), "refused", ("-3",)),
    Case("verify-declared-huge-dim", _verify_with((2**40, 4)), "refused", ("GiB",)),
]
