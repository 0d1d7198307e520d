"""Checks on a parsed ModelProto before anything builds on it.

A malformed model must be refused with a reason, not crash a pass, hang, allocate
what a tensor merely declares, or come out "optimized" and just as broken. These
checks read only the protobuf's small fields (never a tensor's data) and find what
onnxruntime also refuses:

* tensors whose data does not fit their declaration: unknown data type, negative
  dims, raw_data or typed values of the wrong size or in the wrong field, a declared
  size with no data (a "zip bomb" Constant declaring 2^62 elements and holding none),
  external-data fields that are not numbers or a length that disagrees with the shape;
* attributes whose declared type is not the field that holds the value, or not the
  type the ONNX operator's schema gives (Cast's `to` as a string);
* ops in the default ONNX domain that ONNX does not have;
* names: an initializer, graph input or node name given twice in a graph, a subgraph
  defining a value name an enclosing graph already has;
* model-local functions that call themselves, directly or through others;
* names and op types that are not UTF-8 text (protobuf hands them over as bytes);
* what ONNX's own type and shape inference refuses, run strictly (`check_inference`):
  a Cast to an unknown type or without `to`, a Loop whose body has the wrong inputs or
  outputs or no body, a Pad whose pads do not fit its axes, a Slice with step 0, and
  value_info that contradicts what the data computes (a [1, 1] declared over a
  100000 x 100000 ConstantOfShape). onnxruntime refuses all of these too.

onnx's checker (`onnx.checker.check_model`) finds all this and more, but it also
refuses models onnxruntime runs (value_info without a shape field, for one) and wants
a path for models over 2 GB; these checks are the subset that matters here.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from functools import lru_cache

import onnx
from onnx import AttributeProto, TensorProto

from graphopt.errors import ModelError

__all__ = ["check_proto_contents", "check_inference", "MAX_MESSAGE_DEPTH_HINT"]

#: Ops onnxruntime registers in the default domain that ONNX does not have (its CPU kernel
#: table); graphopt's ort-cpu/ort-cuda lowering of graphopt.RMSNorm writes SimplifiedLayerNormalization.
ONNXRUNTIME_DEFAULT_DOMAIN_OPS = frozenset(
    {"SimplifiedLayerNormalization", "Affine", "Crop", "DynamicSlice", "ImageScaler", "ParametricSoftplus", "Scale", "ScaledTanh"}
)

#: What protobuf's own limit means for graphs: about 33 levels of If/Loop nesting.
MAX_MESSAGE_DEPTH_HINT = "subgraphs are nested too deeply (protobuf reads at most 100 message levels, about 33 levels of If/Loop)"

# TensorProto data types and the typed field that holds their values (ONNX's rules).
_FIELD_OF_TYPE: dict[int, str] = {
    TensorProto.FLOAT: "float_data",
    TensorProto.COMPLEX64: "float_data",
    TensorProto.DOUBLE: "double_data",
    TensorProto.COMPLEX128: "double_data",
    TensorProto.INT64: "int64_data",
    TensorProto.UINT32: "uint64_data",
    TensorProto.UINT64: "uint64_data",
    TensorProto.STRING: "string_data",
}
_TYPED_FIELDS = ("float_data", "int32_data", "string_data", "int64_data", "double_data", "uint64_data")
#: Types whose typed field holds one value per element (two for complex); packed sub-byte types are not counted.
_WHOLE_BYTE_TYPES: frozenset[int] = frozenset(
    {
        TensorProto.FLOAT, TensorProto.UINT8, TensorProto.INT8, TensorProto.UINT16, TensorProto.INT16, TensorProto.INT32,
        TensorProto.INT64, TensorProto.STRING, TensorProto.BOOL, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.UINT32,
        TensorProto.UINT64, TensorProto.COMPLEX64, TensorProto.COMPLEX128, TensorProto.BFLOAT16,
        TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E4M3FNUZ, TensorProto.FLOAT8E5M2, TensorProto.FLOAT8E5M2FNUZ,
    }
)  # fmt: skip
_SUB_BYTE_BITS: dict[int, int] = {TensorProto.INT4: 4, TensorProto.UINT4: 4, TensorProto.FLOAT4E2M1: 4}
for _name, _bits in (("INT2", 2), ("UINT2", 2), ("FLOAT6E2M3", 6), ("FLOAT6E3M2", 6), ("FLOAT8E8M0", 8)):
    if hasattr(TensorProto, _name):
        _SUB_BYTE_BITS[getattr(TensorProto, _name)] = _bits

# AttributeProto types and the field holding the value.
_ATTRIBUTE_FIELD: dict[int, str] = {
    AttributeProto.FLOAT: "f",
    AttributeProto.INT: "i",
    AttributeProto.STRING: "s",
    AttributeProto.TENSOR: "t",
    AttributeProto.GRAPH: "g",
    AttributeProto.SPARSE_TENSOR: "sparse_tensor",
    AttributeProto.TYPE_PROTO: "tp",
    AttributeProto.FLOATS: "floats",
    AttributeProto.INTS: "ints",
    AttributeProto.STRINGS: "strings",
    AttributeProto.TENSORS: "tensors",
    AttributeProto.GRAPHS: "graphs",
    AttributeProto.SPARSE_TENSORS: "sparse_tensors",
    AttributeProto.TYPE_PROTOS: "type_protos",
}
_TYPE_OF_FIELD = {field: kind for kind, field in _ATTRIBUTE_FIELD.items()}
_SCALAR_ATTRIBUTE_FIELDS = ("f", "i", "s", "t", "g", "sparse_tensor", "tp")
_LIST_ATTRIBUTE_FIELDS = ("floats", "ints", "strings", "tensors", "graphs", "sparse_tensors", "type_protos")
_ATTRIBUTE_WORDS: dict[int, str] = {
    AttributeProto.FLOAT: "a float", AttributeProto.INT: "an int", AttributeProto.STRING: "a string", AttributeProto.TENSOR: "a tensor",
    AttributeProto.GRAPH: "a graph", AttributeProto.SPARSE_TENSOR: "a sparse tensor", AttributeProto.TYPE_PROTO: "a type",
    AttributeProto.FLOATS: "floats", AttributeProto.INTS: "ints", AttributeProto.STRINGS: "strings", AttributeProto.TENSORS: "tensors",
    AttributeProto.GRAPHS: "graphs", AttributeProto.SPARSE_TENSORS: "sparse tensors", AttributeProto.TYPE_PROTOS: "types",
}  # fmt: skip


def check_proto_contents(proto: onnx.ModelProto, where: str, mapped_initializers: frozenset[str] = frozenset()) -> None:
    """Raise ModelError naming `where` and the first problem found.

    `mapped_initializers`: main-graph initializers whose raw_data fast_io cut out of the
    parsed skeleton (it checked their sizes itself)."""
    opsets = {o.domain: o.version for o in proto.opset_import}
    default_opset = opsets.get("", opsets.get("ai.onnx", 0))
    functions = {(f.domain, f.name, f.overload) for f in proto.functions}
    checker = _Checker(where, default_opset, functions)
    checker.graph(proto.graph, outer=frozenset(), mapped=mapped_initializers)
    for function in proto.functions:
        scope = f"function {function.domain}.{function.name}"
        function_opset = {o.domain: o.version for o in function.opset_import}.get("", default_opset)
        for node in function.node:
            checker.node(node, scope, outer=frozenset(), opset=function_opset)
    _check_function_recursion(proto, where)


class _Checker:
    def __init__(self, where: str, default_opset: int, functions: set[tuple[str, str, str]]) -> None:
        self.where = where
        self.default_opset = default_opset
        self.functions = functions

    def fail(self, message: str) -> None:
        raise ModelError(f"{self.where}: {message}")

    def text(self, value: str | bytes, what: str) -> str:
        """A string field; protobuf hands over one that is not UTF-8 as bytes."""
        if isinstance(value, bytes):
            self.fail(f"{what} {value!r} is not valid UTF-8 text")
        return value  # type: ignore[return-value]

    def graph(self, graph: onnx.GraphProto, outer: frozenset[str], mapped: frozenset[str] = frozenset()) -> None:
        scope = f"graph {self.text(graph.name, 'a graph name') or 'main'}"
        for value in [*graph.input, *graph.output, *graph.value_info]:
            self.text(value.name, f"{scope}: a value name")
        for tensor in graph.initializer:
            self.text(tensor.name, f"{scope}: an initializer name")
        if len(graph.sparse_initializer):
            self.fail(f"{scope}: sparse initializers are not supported (initializer '{graph.sparse_initializer[0].values.name}')")
        defined: set[str] = set()
        inputs: set[str] = set()
        for value in graph.input:
            if value.name in inputs:
                self.fail(f"{scope}: input '{value.name}' is declared twice")
            inputs.add(value.name)
        seen_initializers: set[str] = set()
        for tensor in graph.initializer:
            if tensor.name in seen_initializers:
                self.fail(f"{scope}: initializer '{tensor.name}' is defined twice")
            seen_initializers.add(tensor.name)
            if tensor.name not in mapped:
                self.tensor(tensor, f"{scope}: initializer '{tensor.name}'")
        defined = inputs | seen_initializers  # an input may also have an initializer (its default value)
        node_names: set[str] = set()
        for node in graph.node:
            defined.update(name for name in node.output if name)
            if node.name and node.name in node_names:  # onnxruntime refuses these too
                self.fail(f"{scope}: two nodes are named '{node.name}'")
            node_names.add(node.name)
        shadowing = sorted((defined - {""}) & outer)
        if shadowing:
            self.fail(f"{scope} defines '{shadowing[0]}' again: an enclosing graph already defines it (names must be unique across nested graphs)")
        inner_outer = outer | defined
        for node in graph.node:
            self.node(node, scope, inner_outer, self.default_opset)

    def node(self, node: onnx.NodeProto, scope: str, outer: frozenset[str], opset: int) -> None:
        for field in (node.name, node.op_type, node.domain, *node.input, *node.output):
            self.text(field, f"{scope}: a node's name, op type, domain or value name")
        label = f"{scope}: node {node.name or node.op_type}"
        default_domain = node.domain in ("", "ai.onnx")
        schema = None
        if default_domain and (node.domain, node.op_type, node.overload) not in self.functions:
            if not onnx.defs.has(node.op_type, "") and node.op_type not in ONNXRUNTIME_DEFAULT_DOMAIN_OPS:
                self.fail(f"{label}: '{node.op_type}' is not an ONNX operator (default domain; custom ops need their own domain)")
            schema = _schema(node.op_type, opset)
        for attribute in node.attribute:
            self.attribute(attribute, label, schema)
            if attribute.type == AttributeProto.TENSOR and attribute.HasField("t"):
                self.tensor(attribute.t, f"{label}: attribute '{attribute.name}'")
            for tensor in attribute.tensors:
                self.tensor(tensor, f"{label}: attribute '{attribute.name}'")
            if attribute.HasField("g"):
                self.graph(attribute.g, outer)
            for graph in attribute.graphs:
                self.graph(graph, outer)

    def attribute(self, attribute: AttributeProto, label: str, schema: onnx.defs.OpSchema | None) -> None:
        self.text(attribute.name, f"{label}: an attribute name")
        if attribute.ref_attr_name:
            return  # a function body's reference to the caller's attribute: no value of its own
        filled = [f for f in _SCALAR_ATTRIBUTE_FIELDS if attribute.HasField(f)] + [f for f in _LIST_ATTRIBUTE_FIELDS if len(getattr(attribute, f))]
        declared = _ATTRIBUTE_FIELD.get(attribute.type)
        if declared is None:
            if attribute.type == AttributeProto.UNDEFINED:  # onnx's checker and onnxruntime refuse it; onnx-ir cannot write it
                self.fail(f"{label}: attribute '{attribute.name}' has no type (UNDEFINED)")
            self.fail(f"{label}: attribute '{attribute.name}' has an unknown type ({attribute.type})")
        else:
            wrong = [f for f in filled if f != declared]
            if wrong:
                held = _ATTRIBUTE_WORDS[_TYPE_OF_FIELD[wrong[0]]]
                self.fail(f"{label}: attribute '{attribute.name}' is declared as {_ATTRIBUTE_WORDS[attribute.type]} but holds {held}")
        if attribute.name == "to" and attribute.type == AttributeProto.INT and schema is not None and schema.name == "Cast":
            if attribute.i not in TensorProto.DataType.values() or attribute.i == TensorProto.UNDEFINED:
                self.fail(f"{label}: Cast's 'to' ({attribute.i}) is not an ONNX data type")
        if schema is not None and attribute.name in schema.attributes and declared is not None:
            expected = int(schema.attributes[attribute.name].type.value)  # type: ignore[attr-defined]  # a pybind11 enum
            if expected != attribute.type and expected in _ATTRIBUTE_WORDS:
                self.fail(
                    f"{label}: attribute '{attribute.name}' of {schema.name} must be {_ATTRIBUTE_WORDS[expected]}, "
                    f"not {_ATTRIBUTE_WORDS[attribute.type]}"
                )

    def tensor(self, tensor: TensorProto, label: str) -> None:
        data_type = tensor.data_type
        if data_type == TensorProto.UNDEFINED or data_type not in TensorProto.DataType.values():
            self.fail(f"{label} has an unknown data type ({data_type})")
        if any(d < 0 for d in tensor.dims):
            self.fail(f"{label} has a negative dimension {list(tensor.dims)}")
        count = math.prod(tensor.dims)
        if tensor.data_location not in (TensorProto.DEFAULT, TensorProto.EXTERNAL):
            self.fail(f"{label} has an unknown data_location ({tensor.data_location})")
        if tensor.HasField("segment"):  # onnxruntime refuses segmented tensors; their data is elsewhere
            self.fail(f"{label} uses the segment field (a segmented tensor), which onnxruntime and graphopt do not support")
        if tensor.data_location == TensorProto.EXTERNAL:
            self.external(tensor, label, count)
            return
        typed = [f for f in _TYPED_FIELDS if len(getattr(tensor, f))]
        raw = tensor.HasField("raw_data")
        if raw and typed:
            self.fail(f"{label} holds both raw_data and {typed[0]}")
        if raw:
            expected = _raw_bytes(data_type, count)
            if data_type == TensorProto.STRING:
                self.fail(f"{label} is a string tensor with raw_data (strings go in string_data)")
            if expected is not None and len(tensor.raw_data) != expected:
                self.fail(f"{label} declares {list(tensor.dims)} ({expected} bytes) but its raw_data has {len(tensor.raw_data)} bytes")
            return
        field = _FIELD_OF_TYPE.get(data_type, "int32_data")
        if typed and typed != [field]:
            self.fail(f"{label} keeps its values in {typed[0]}, but a {TensorProto.DataType.Name(data_type)} tensor keeps them in {field}")
        if data_type in _WHOLE_BYTE_TYPES:
            per_element = 2 if data_type in (TensorProto.COMPLEX64, TensorProto.COMPLEX128) else 1
            found = len(getattr(tensor, field))
            if found != count * per_element:
                what = "no data" if found == 0 else f"{found} values"
                self.fail(f"{label} declares {list(tensor.dims)} ({count} elements) but holds {what}")
        elif count and not typed:
            self.fail(f"{label} declares {list(tensor.dims)} ({count} elements) but holds no data")

    def external(self, tensor: TensorProto, label: str, count: int) -> None:
        fields = {entry.key: entry.value for entry in tensor.external_data}
        location = fields.get("location", "")
        if not location:
            self.fail(f"{label} is stored externally but names no file")
        if "\0" in location:
            self.fail(f"{label}: its external data location contains a NUL character")
        for key in ("offset", "length"):
            value = fields.get(key)
            if value is not None and not (value.isascii() and value.isdigit()):
                self.fail(f"{label}: external data {key} {value[:40]!r} is not a non-negative integer")
            if value is not None and (len(value) > 19 or int(value) >= 2**63):  # int64, as onnxruntime reads it
                self.fail(f"{label}: external data {key} {value[:40]!r}{'...' if len(value) > 40 else ''} is larger than any file")
        expected = _raw_bytes(tensor.data_type, count)
        if "length" in fields and expected is not None and int(fields["length"]) != expected:
            self.fail(f"{label} declares {list(tensor.dims)} ({expected} bytes) but its external data length is {fields['length']}")


def check_inference(proto: onnx.ModelProto, where: str) -> None:
    """Run ONNX's type and shape inference strictly over `proto` (a model without its
    weights' bytes is enough) and raise ModelError with its first complaint.

    Inference reads no weight data except small shape-like constants, so large raw_data
    is set aside for the call (and put back): the protobuf handed to onnx stays small."""
    stashed: list[tuple[TensorProto, bytes]] = []
    for tensor in _all_initializers(proto.graph):
        if len(tensor.raw_data) > 4096:
            stashed.append((tensor, tensor.raw_data))
            tensor.ClearField("raw_data")
    try:
        onnx.shape_inference.infer_shapes(proto, check_type=True, strict_mode=True)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError, RuntimeError) as error:
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        message = lines[0] if lines else type(error).__name__
        message = message.replace("[ShapeInferenceError] Inference error(s): ", "")
        raise ModelError(f"{where}: invalid model (ONNX type/shape inference): {message}") from None
    finally:
        for tensor, data in stashed:
            tensor.raw_data = data


def _all_initializers(graph: onnx.GraphProto) -> Iterator[TensorProto]:
    yield from graph.initializer
    for node in graph.node:
        for attribute in node.attribute:
            for sub in ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs):
                yield from _all_initializers(sub)


def _raw_bytes(data_type: int, count: int) -> int | None:
    """Bytes of `count` elements of `data_type` stored raw; None for strings."""
    if data_type == TensorProto.STRING:
        return None
    if data_type in _SUB_BYTE_BITS:
        return math.ceil(count * _SUB_BYTE_BITS[data_type] / 8)
    return count * onnx.helper.tensor_dtype_to_np_dtype(data_type).itemsize


@lru_cache(maxsize=4096)
def _schema(op_type: str, opset: int) -> onnx.defs.OpSchema | None:
    try:
        return onnx.defs.get_schema(op_type, max(opset, 1), "")
    except onnx.defs.SchemaError:
        return None  # an op newer than the model's opset: leave that judgement to others


def _calls(nodes: Iterator[onnx.NodeProto] | list[onnx.NodeProto]) -> Iterator[tuple[str, str, str]]:
    """(domain, op_type, overload) of every node, subgraphs included."""
    for node in nodes:
        yield node.domain, node.op_type, node.overload
        for attribute in node.attribute:
            graphs = ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs)
            for graph in graphs:
                yield from _calls(list(graph.node))


def _check_function_recursion(proto: onnx.ModelProto, where: str) -> None:
    keys = {(f.domain, f.name, f.overload): f for f in proto.functions}
    callees = {key: sorted({call for call in _calls(list(f.node)) if call in keys}) for key, f in keys.items()}
    state: dict[tuple[str, str, str], int] = {}  # 1: on the current path, 2: done

    def name(key: tuple[str, str, str]) -> str:
        return f"{key[0]}.{key[1]}" + (f":{key[2]}" if key[2] else "")

    for start in callees:
        if state.get(start):
            continue
        path = [start]
        stack = [iter(callees[start])]
        state[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
                continue
            if state.get(nxt) == 1:
                cycle = path[path.index(nxt) :] + [nxt]
                raise ModelError(f"{where}: model-local function {name(nxt)} is recursive ({' -> '.join(map(name, cycle))}); ONNX functions must not call themselves")
            if not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(callees[nxt]))


def tensor_protos(proto: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    """Every TensorProto of the model: initializers and tensor attributes, in subgraphs and functions too."""
    def graph_tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
        yield from graph.initializer
        for node in graph.node:
            for attribute in node.attribute:
                if attribute.HasField("t"):
                    yield attribute.t
                yield from attribute.tensors
                for sub in ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs):
                    yield from graph_tensors(sub)

    yield from graph_tensors(proto.graph)
    for function in proto.functions:
        for node in function.node:
            for attribute in node.attribute:
                if attribute.HasField("t"):
                    yield attribute.t
