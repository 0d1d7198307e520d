"""A fixed-size KV buffer shared by past and present (onnxruntime's past_present_share_buffer).

onnxruntime's GroupQueryAttention appends the new k, v into present_key / present_value; when
the caller binds the same max-length buffer as past and present (io-binding), it writes the
new tokens in place at seqlens_k and reads only the valid prefix (total_sequence_length): no
copy of the cache per step, and shapes that do not change from step to step. The
onnxruntime-genai builder's models run that way.

graphopt's GroupQueryAttention (FuseGroupQueryAttention) reads the past length from the past
input's shape (Shape(past_k)[2]: the cache positions, seqlens_k = past + seq - 1, the rotary
caches padded to absolute positions). With a max-length buffer that shape is the buffer's
length, not the number of valid tokens. This pass takes the past length from the
attention_mask instead, as the builder's models do: past = attention_mask's length - the new
tokens (input_ids' length, or another input's seq axis), replacing each Shape read of a past input's
sequence axis (and of its batch axis, read from the same input), and giving every layer one
seqlens_k, total_sequence_length and query_seqlens. The model then runs both ways: with a growing
cache (past of `past` tokens, mask of past + seq) and with a shared buffer (past and present one
buffer of max length, mask of past + seq).

Static shapes (CUDA graphs): as the builder's models, seqlens_k is the mask's row sum - 1 (on the
device: ReduceSum, Sub, Cast) and total_sequence_length its length (Shape, Gather, Cast: a CPU
input of GroupQueryAttention, the builder's form onnxruntime captures), so a [batch, max_length]
mask with ones over the valid tokens and zeros after (onnxruntime-genai's static mask under
enable_cuda_graph) gives the right lengths with shapes that never change. The rotary caches
FoldRotaryIntoGroupQueryAttention writes (the export's rows for positions past .. past + seq - 1,
padded at the front by the past length) become tables of every position below the mask's length
(`_position_tables`: the same nodes with the new tokens' count read as the mask's length and the
past as 0): GroupQueryAttention indexes them by absolute position, and nothing in them reads the
past length, which a fixed-length mask would give wrong (its length - seq) and which, read from
Shape on the host, fed the device through a copy every step (a Memcpy that refuses graph capture).
Where the export reads the past length elsewhere (the causal half of an attention_bias built from a
padding mask input, on ort-cpu) that part still takes it from the mask's length: right with a
growing mask, and with a fixed-length one right for one-token steps (every valid key precedes the
new token); a prefill runs with a mask of the prompt's length, as onnxruntime-genai's does.

With `max_length` (`--kv-max-length`: the longest sequence the buffer holds, the builder's context
length) those tables are computed once, for positions 0 .. max_length - 1, and stored as constants
(the builder's cos/sin caches): a decode step then runs no table nodes at all (~20 small ops a step:
on the CPU and on a GPU without CUDA graphs each one costs). A run past max_length is outside the
tables (onnxruntime refuses it).

An export without an attention_mask input gets one, [batch, total_sequence_length] int64 (ones
over the valid tokens, as the builder's runner feeds). Refused (the model is left as it
is, with the reason) where a past input is read other than by GroupQueryAttention's past inputs
and Shape, where a present output is not GroupQueryAttention's, or where no input counts the new
tokens (input_ids [batch, seq], or an input whose axis 1 is the query's symbolic seq).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import onnx_ir as ir

from graphopt.ops.targets import MS_DOMAIN
from graphopt.passes._common import detach_and_remove, record

__all__ = ["share_kv_buffer", "rotary_table_nodes", "KV_BUFFER_MODES", "PRESENT_LENGTH", "PAST_LENGTH"]

KV_BUFFER_MODES = ("growing", "shared")
# the present outputs' sequence axis: max(past buffer, total) in onnxruntime's kernel
PRESENT_LENGTH = "present_sequence_length"
# the mask's length - the new tokens: the past's length with a growing mask, not with a static one
PAST_LENGTH = "kv_buffer_past_length"


def _gqa_nodes(graph: ir.Graph) -> list[ir.Node]:
    return [n for n in graph if n.domain == MS_DOMAIN and n.op_type == "GroupQueryAttention"]


def _problem(graph: ir.Graph, gqas: list[ir.Node]) -> str | None:
    """Why the past length cannot be moved onto the attention_mask, or None."""
    if not gqas:
        return "no com.microsoft.GroupQueryAttention in the model"
    graph_inputs = set(map(id, graph.inputs))
    graph_outputs = set(map(id, graph.outputs))
    for node in gqas:
        for index in (3, 4):
            past = node.inputs[index] if len(node.inputs) > index else None
            if past is None or id(past) not in graph_inputs:
                return f"{node.name}'s past input {index} is not a graph input"
            for user, slot in past.uses():
                if user.op_type == "Shape" and user.domain in ("", "ai.onnx"):
                    continue
                if user.domain == MS_DOMAIN and user.op_type == "GroupQueryAttention" and slot in (3, 4):
                    continue
                return f"the past input {past.name} is read by {user.op_type} {user.name}, not only by GroupQueryAttention and Shape"
            if past.shape is None or len(past.shape) != 4:
                return f"the past input {past.name} is not 4-D [batch, kv_heads, past, head]"
        for index in (1, 2):
            present = node.outputs[index]
            if id(present) not in graph_outputs or len(present.uses()):
                return f"{node.name}'s present output {index} is not only a graph output"
    if _new_tokens_input(graph, gqas[0]) is None:
        return "no graph input counts the new tokens (input_ids [batch, seq], or one whose axis 1 is the query's seq)"
    mask = next((v for v in graph.inputs if v.name == "attention_mask"), None)
    if mask is not None and (mask.shape is None or len(mask.shape) != 2):
        return "the attention_mask input is not [batch, total]"
    return None


def _new_tokens_input(graph: ir.Graph, gqa: ir.Node) -> ir.Value | None:
    """input_ids [batch, seq], else the graph input whose axis 1 is the query's symbolic seq (hidden
    states [batch, seq, hidden])."""
    ids = _input(graph, "input_ids", rank=2)
    if ids is not None:
        return ids
    query = gqa.inputs[0].shape if gqa.inputs[0] is not None else None
    if query is None or len(query) != 3 or isinstance(query[1], int) or query[1].value is None:
        return None
    pasts = {id(v) for v in gqa.inputs[3:5]}
    for value in graph.inputs:
        if id(value) in pasts or value.shape is None or len(value.shape) < 2 or value.name == "attention_mask":
            continue
        if not isinstance(value.shape[1], int) and value.shape[1].value == query[1].value:
            return value
    return None


def _input(graph: ir.Graph, name: str, rank: int) -> ir.Value | None:
    value = next((v for v in graph.inputs if v.name == name), None)
    return value if value is not None and value.shape is not None and len(value.shape) == rank else None


def _shape_range(node: ir.Node, rank: int) -> range:
    """The axes a Shape node reads (its start / end attributes, negative ones counted from the end)."""
    start = node.attributes["start"].as_int() if "start" in node.attributes else 0
    end = node.attributes["end"].as_int() if "end" in node.attributes else rank
    start, end = (max(0, min(rank, a + rank if a < 0 else a)) for a in (start, end))
    return range(start, end)


def share_kv_buffer(model: ir.Model, *, max_length: int | None = None, stats: Any = None) -> tuple[int, str | None]:
    """(Shape reads rewritten, None), or (0, why not) with the model unchanged. `max_length`: the rotary
    tables for that many positions, as constants for the fold that follows (None: every step's own)."""
    started = time.perf_counter()
    graph = model.graph
    gqas = _gqa_nodes(graph)
    problem = _problem(graph, gqas)
    if problem is not None:
        record(stats, 0, started)
        return 0, problem
    pasts: dict[int, ir.Value] = {id(v): v for node in gqas for v in node.inputs[3:5] if v is not None}  # graph inputs (_problem)
    new_tokens = _new_tokens_input(graph, gqas[0])
    assert new_tokens is not None  # _problem checked it
    mask = _input(graph, "attention_mask", rank=2)
    if mask is None:  # read for its length only
        past_shape = next(iter(pasts.values())).shape
        batch_dim = past_shape[0] if past_shape is not None else "batch"
        mask = ir.Value(name="attention_mask", type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape([batch_dim, "total_sequence_length"]))
        graph.inputs.append(mask)
    made = [
        ir.Node("", "Shape", [mask], [ir.AttrInt64("start", 1), ir.AttrInt64("end", 2)], name="kv_buffer_total"),
        ir.Node("", "Shape", [new_tokens], [ir.AttrInt64("start", 1), ir.AttrInt64("end", 2)], name="kv_buffer_seq"),
    ]
    made.append(ir.Node("", "Sub", [made[0].outputs[0], made[1].outputs[0]], name="kv_buffer_past"))
    made.append(ir.Node("", "Shape", [new_tokens], [ir.AttrInt64("start", 0), ir.AttrInt64("end", 1)], name="kv_buffer_batch"))
    past_length, batch = made[2].outputs[0], made[3].outputs[0]
    past_length.name, batch.name = PAST_LENGTH, "kv_buffer_batch_size"
    graph.insert_before(next(iter(graph)), made)
    # the batch too from one input: every layer's seqlens_k, total and rotary pads become one
    # computation (CSE) instead of one per past input
    shared_axes = {0: batch, 2: past_length}

    rewritten = 0
    for past in pasts.values():
        for user, _ in list(past.uses()):
            if user.op_type != "Shape":
                continue
            axes = _shape_range(user, 4)
            if not set(axes) & set(shared_axes):
                continue
            pieces: list[ir.Value] = []
            new_nodes: list[ir.Node] = []
            for axis in axes:
                if axis in shared_axes:
                    pieces.append(shared_axes[axis])
                    continue
                part = ir.Node("", "Shape", [past], [ir.AttrInt64("start", axis), ir.AttrInt64("end", axis + 1)], name=f"{user.name}_axis{axis}")
                new_nodes.append(part)
                pieces.append(part.outputs[0])
            if len(pieces) > 1:
                concat = ir.Node("", "Concat", pieces, [ir.AttrInt64("axis", 0)], name=f"{user.name}_with_mask_past")
                new_nodes.append(concat)
                result = concat.outputs[0]
            else:
                result = pieces[0]
            if new_nodes:
                graph.insert_before(user, new_nodes)
            user.outputs[0].replace_all_uses_with(result, replace_graph_outputs=True)
            detach_and_remove(model, user)
            rewritten += 1
    _share_lengths(graph, gqas, mask, made[1].outputs[0], batch)
    rows = made[0].outputs[0] if max_length is None else _constant(graph, "kv_buffer_max_length", np.array([max_length], np.int64))
    _position_tables(graph, gqas, past_length, made[1].outputs[0], rows, new_tokens)
    _forget_past_shapes(graph, gqas, pasts)
    record(stats, rewritten, started)
    return rewritten, None


def rotary_table_nodes(graph: ir.Graph) -> list[ir.Node]:
    """The nodes that compute GroupQueryAttention's rotary caches (inputs 7 and 8), transitively: with
    `max_length` every input of theirs is constant, and api folds exactly these."""
    found: dict[int, ir.Node] = {}
    todo = [v for node in _gqa_nodes(graph) for v in node.inputs[7:9] if v is not None]
    while todo:
        producer = todo.pop().producer()
        if producer is not None and id(producer) not in found:
            found[id(producer)] = producer
            todo.extend(v for v in producer.inputs if v is not None)
    return list(found.values())


def _constant(graph: ir.Graph, name: str, array: np.ndarray) -> ir.Value:
    value = ir.Value(name=name, const_value=ir.tensor(array, name=name))
    graph.register_initializer(value)
    return value


def _share_lengths(graph: ir.Graph, gqas: list[ir.Node], mask: ir.Value, seq: ir.Value, batch: ir.Value) -> None:
    """One seqlens_k (the mask's row sums - 1), total_sequence_length (its length) and query_seqlens
    (seq per row; where given) for every layer, as the builder's models compute them, instead of each
    layer's own from its k, v."""
    one = _constant(graph, "kv_buffer_one", np.array([1], np.int64))
    axis = _constant(graph, "kv_buffer_axis", np.array(1, np.int64))
    rows = mask
    nodes: list[ir.Node] = []
    if mask.dtype != ir.DataType.INT64:  # ReduceSum of an int64 mask, as the builder's
        nodes.append(ir.Node("", "Cast", [mask], [ir.AttrInt64("to", ir.DataType.INT64)], name="kv_buffer_mask_int64"))
        rows = nodes[-1].outputs[0]
    nodes += [
        ir.Node("", "ReduceSum", [rows, one], [ir.AttrInt64("keepdims", 0)], name="kv_buffer_valid"),
        ir.Node("", "Shape", [mask], name="kv_buffer_mask_shape"),
        ir.Node("", "Expand", [seq, batch], name="kv_buffer_seq_rows"),
    ]
    valid, shape, seq_rows = (n.outputs[0] for n in nodes[-3:])
    nodes += [ir.Node("", "Sub", [valid, one], name="kv_buffer_last_rows"), ir.Node("", "Gather", [shape, axis], [ir.AttrInt64("axis", 0)], name="kv_buffer_total_length")]
    last, total = nodes[-2].outputs[0], nodes[-1].outputs[0]
    seqlens = ir.Node("", "Cast", [last], [ir.AttrInt64("to", ir.DataType.INT32)], name="kv_buffer_seqlens_k")
    total32 = ir.Node("", "Cast", [total], [ir.AttrInt64("to", ir.DataType.INT32)], name="kv_buffer_total_sequence_length")
    query = ir.Node("", "Cast", [seq_rows], [ir.AttrInt64("to", ir.DataType.INT32)], name="kv_buffer_query_seqlens")
    nodes += [seqlens, total32, query]
    for node in nodes:
        node.outputs[0].name = node.name
    graph.insert_after(next(n for n in graph if n.name == "kv_buffer_batch"), nodes)
    for node in gqas:
        node.replace_input_with(5, seqlens.outputs[0])
        node.replace_input_with(6, total32.outputs[0])
        if len(node.inputs) > 16 and node.inputs[16] is not None:
            node.replace_input_with(16, query.outputs[0])


def _position_tables(graph: ir.Graph, gqas: list[ir.Node], past_length: ir.Value, seq: ir.Value, total: ir.Value, new_tokens: ir.Value) -> None:
    """Each rotary cache Pad(rows, pads) of a GroupQueryAttention with do_rotary replaced by its rows
    computed again with the new tokens' count (`seq`, or the export's own Shape read of it) read as
    the mask's length (`total`; or the constant max length) and the past length as 0: positions
    0 .. total - 1, the table it indexes. Left as it is (right with a growing mask only) where the rows read another input than
    through those (a position_ids input, an activation's shape); every family of
    tests/llm_families.py is of the first kind."""
    substitutes = {id(past_length): _constant(graph, "kv_buffer_zero", np.array([0], np.int64)), id(seq): total}
    # the export's own reads of the new tokens' count too (CSE merges them with `seq` after this pass)
    for node in graph:
        if node.op_type == "Shape" and node.inputs[0] is new_tokens and list(_shape_range(node, 2)) == [1]:
            substitutes[id(node.outputs[0])] = total
    made: dict[int, ir.Value | None] = {}
    for node in gqas:
        if "do_rotary" not in node.attributes or node.attributes["do_rotary"].as_int() != 1:
            continue
        for index in (7, 8):
            cache = node.inputs[index] if len(node.inputs) > index else None
            pad = cache.producer() if cache is not None else None
            if pad is None or pad.op_type != "Pad" or pad.domain not in ("", "ai.onnx"):
                continue
            table = _recomputed(graph, pad.inputs[0], substitutes, made)
            if table is not None and table is not pad.inputs[0]:
                node.replace_input_with(index, table)


def _recomputed(graph: ir.Graph, value: ir.Value | None, substitutes: dict[int, ir.Value], made: dict[int, ir.Value | None]) -> ir.Value | None:
    """value computed again with the substitutes in place of the values they name (new nodes after
    the originals), value itself where it reads none of them, None where it reads a graph input
    otherwise (or a node with subgraphs)."""
    if value is None:
        return None
    if id(value) in substitutes:
        return substitutes[id(value)]
    if id(value) in made:
        return made[id(value)]
    producer = value.producer()
    if producer is None:  # a graph input or an initializer
        made[id(value)] = value if value.const_value is not None or value.name in graph.initializers else None
        return made[id(value)]
    inputs = [_recomputed(graph, v, substitutes, made) if v is not None else v for v in producer.inputs]
    if any(new is None and old is not None for new, old in zip(inputs, producer.inputs, strict=True)) or any(
            a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS) for a in producer.attributes.values()):
        for output in producer.outputs:
            made[id(output)] = None
        return None
    if all(new is old for new, old in zip(inputs, producer.inputs, strict=True)):
        for output in producer.outputs:
            made[id(output)] = output
        return value
    copies = _device_range(graph, producer, inputs)
    if copies is None:
        copies = [ir.Node(producer.domain, producer.op_type, inputs, list(producer.attributes.values()), overload=producer.overload,
                          num_outputs=len(producer.outputs), name=f"{producer.name}_position_table", version=producer.version)]
    graph.insert_after(producer, copies)
    for old, new in zip(producer.outputs, copies[-1].outputs, strict=True):
        new.name = f"{old.name}_position_table"
        if old.dtype is not None:
            new.dtype = old.dtype
        made[id(old)] = new
    return made[id(value)]


def _device_range(graph: ir.Graph, node: ir.Node, inputs: list[ir.Value | None]) -> list[ir.Node] | None:
    """Range(0, n, 1) as CumSum(ConstantOfShape([n], 1), exclusive): the same 0 .. n - 1, made on the
    device. onnxruntime's CUDA Range reads start, limit and delta with a synchronous copy to the
    host (not capturable), or, placed on the CPU with a shape-derived limit, its output reaches the
    device through a Memcpy (which refuses graph capture); ConstantOfShape takes the shape on the
    host and fills on the device. None where Range is not of that form."""
    if node.op_type != "Range" or node.domain not in ("", "ai.onnx") or len(inputs) != 3 or inputs[1] is None:
        return None
    start, delta = (ir.convenience.get_const_tensor(v) if v is not None else None for v in (inputs[0], inputs[2]))
    if start is None or delta is None or start.size != 1 or delta.size != 1:
        return None
    first, step = start.numpy().reshape(-1)[0], delta.numpy().reshape(-1)[0]
    if first != 0 or step != 1:
        return None
    one = np.ones([1], start.numpy().dtype)
    length = ir.Node("", "Reshape", [inputs[1], _constant(graph, f"{node.name}_length_shape", np.array([1], np.int64))],
                     name=f"{node.name}_length")
    ones = ir.Node("", "ConstantOfShape", [length.outputs[0]], [ir.AttrTensor("value", ir.tensor(one))], name=f"{node.name}_ones")
    count = ir.Node("", "CumSum", [ones.outputs[0], _constant(graph, f"{node.name}_axis", np.array(0, np.int64))],
                    [ir.AttrInt64("exclusive", 1)], name=f"{node.name}_position_table")
    length.outputs[0].name, ones.outputs[0].name = length.name, ones.name
    return [length, ones, count]


def _forget_past_shapes(graph: ir.Graph, gqas: list[ir.Node], pasts: dict[int, ir.Value]) -> None:
    """The recorded shapes that count on the past input's length (Symbolic `past` expressions) no
    longer hold with a max-length buffer: drop them; the present outputs' sequence axis gets a
    name of its own (max(buffer, total) in the kernel)."""
    symbols = {str(v.shape[2]) for v in pasts.values() if v.shape is not None and not isinstance(v.shape[2], int)}
    for node in gqas:
        for present in node.outputs[1:3]:
            if present.shape is not None and len(present.shape) == 4:
                dims: list[Any] = list(present.shape)
                dims[2] = PRESENT_LENGTH
                present.shape = ir.Shape(dims)
    if not symbols:
        return
    outputs = set(map(id, graph.outputs))
    for node in graph:
        for value in node.outputs:
            if id(value) in outputs or value.shape is None:
                continue
            if any(not isinstance(d, int) and any(s in str(d) for s in symbols) for d in value.shape):
                value.shape = None

