"""One LLaMA-style decoder attention block with a KV cache, built with onnx.helper in the
dynamo exporter's style (tests/test_rules_gqa.py; benchmarks/llm_onnx_decode.py).

Inputs: hidden [batch, seq, hidden], attention_mask [batch, past + seq] (int64, 1 = attend),
past_key / past_value [batch, kv_heads, past, head]. Outputs: out [batch, seq, hidden],
present_key / present_value [batch, kv_heads, past + seq, head]. Inside: q, k, v projections
viewed as [batch, heads, seq, head]; rotary (half form) on q and k at positions past .. past + seq
(cos / sin computed from the position, as transformers' export does); Concat of past and new
k / v on the sequence axis (the presents); repeat_kv (Unsqueeze on axis 2, Expand, Reshape);
a causal + padding mask as Where(keep, 0, finfo.min); q and k^T each scaled by
head**-0.25; Softmax; the output projection.

Variants (keyword arguments): `repeat` "expand" (transformers), "tile" (kv heads repeated as a
block), "expand_axis1" (Unsqueeze on axis 1: block order too), "none" (multi-head attention,
kv_heads = heads); `mask` "causal_padding", "causal" (no attention_mask input), "padding" (bidirectional
with padding) or "none"; `rotary` True / False.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F = TensorProto.FLOAT
I64 = TensorProto.INT64


def decoder_block(hidden: int = 32, heads: int = 4, kv_heads: int = 2, repeat: str = "expand", mask: str = "causal_padding",
                  rotary: bool = True, seed: int = 0, dtype: Any = np.float32, qkv_bias: str = "",
                  packed_qkv: tuple[tuple[int, int], ...] = (), packed_width: int = 0, window: int | str = 0) -> onnx.ModelProto:
    """qkv_bias: the projections (of "q", "k", "v") with a constant bias Add after the MatMul, as Qwen2's;
    "kx" puts k's bias first in its Add (the other operand order). packed_qkv: one MatMul of the three weights
    side by side (Phi-3's qkv_proj), q, k, v Slices of it on the last axis at these (start, end) spans (Phi-3's:
    q, then k, then v, nothing between); packed_width: the product's width if wider (columns nobody reads).
    window: a sliding window of that many keys And-ed into the causal mask (kv_pos > q_pos - window, as
    transformers' sliding_window_overlay writes it); "input": its width a run-time value (the past length)."""
    head = hidden // heads
    group = heads // kv_heads
    rng = np.random.default_rng(seed)
    inits: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []

    def const(name: str, array: Any) -> str:
        inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def node(op: str, inputs: list[str], output: str, **attrs: Any) -> str:
        nodes.append(helper.make_node(op, inputs, [output], name=f"n_{output}", **attrs))
        return output

    wq = const("wq", (rng.standard_normal((hidden, heads * head)) / np.sqrt(hidden)).astype(dtype))
    wk = const("wk", (rng.standard_normal((hidden, kv_heads * head)) / np.sqrt(hidden)).astype(dtype))
    wv = const("wv", (rng.standard_normal((hidden, kv_heads * head)) / np.sqrt(hidden)).astype(dtype))
    wo = const("wo", (rng.standard_normal((heads * head, hidden)) / np.sqrt(hidden)).astype(dtype))
    inv_freq = const("inv_freq", (1.0 / 10000 ** (np.arange(0, head, 2) / head)).astype(dtype))
    one_d = {name: const(f"c_{name}", np.array(v, np.int64)) for name, v in
             {"0": [0], "1": [1], "2": [2], "3": [3], "m1": [-1], "head": [head], "half": [head // 2], "big": [2**62],
              "kv": [kv_heads], "group": [group], "heads": [heads]}.items()}
    scalar0, scalar1 = const("s_0", np.array(0, np.int64)), const("s_1", np.array(1, np.int64))

    # sizes, as the exporter reads them: seq, past, total = past + seq
    seq = node("Squeeze", [node("Shape", ["hidden"], "seq_1d", start=1, end=2)], "seq")
    past = node("Squeeze", [node("Shape", ["past_key"], "past_1d", start=2, end=3)], "past")
    total = node("Add", [past, seq], "total")
    batch_1d = node("Shape", ["hidden"], "batch_1d", start=0, end=1)
    seq_1d, total_1d = "seq_1d", node("Reshape", [total, one_d["m1"]], "total_1d")

    def heads_view(x: str, n: int, name: str) -> str:
        shape = node("Concat", [batch_1d, seq_1d, one_d["m1"], one_d["head"]], f"{name}_shape", axis=0)
        return node("Transpose", [node("Reshape", [x, shape], f"{name}_view")], f"{name}_t", perm=[0, 2, 1, 3])

    def project(w: str, name: str, width: int) -> str:
        out = node("MatMul", ["hidden", w], f"{name}_proj" if name not in qkv_bias else f"{name}_mm")
        if name not in qkv_bias:
            return out
        bias = const(f"b{name}", (rng.standard_normal(width) / 4).astype(dtype))
        return node("Add", [bias, out] if f"{name}x" in qkv_bias else [out, bias], f"{name}_proj")

    if packed_qkv:
        arrays = {i.name: numpy_helper.to_array(i) for i in inits}
        w = np.zeros((hidden, max(packed_width, *(end for _, end in packed_qkv))), arrays["wq"].dtype)
        for (start, end), name in zip(packed_qkv, ("wq", "wk", "wv"), strict=True):
            w[:, start:end] = arrays[name]
        inits[:] = [i for i in inits if i.name not in ("wq", "wk", "wv")]
        qkv = node("MatMul", ["hidden", const("wqkv", w)], "qkv_proj")
        parts = [node("Slice", [qkv, const(f"s_{n}", np.array([start], np.int64)), const(f"e_{n}", np.array([end], np.int64)),
                                const(f"a_{n}", np.array([-1], np.int64))], f"{n}_proj") for (start, end), n in zip(packed_qkv, "qkv", strict=True)]
        q, k, v = heads_view(parts[0], heads, "q"), heads_view(parts[1], kv_heads, "k"), heads_view(parts[2], kv_heads, "v")
    else:
        q = heads_view(project(wq, "q", heads * head), heads, "q")
        k = heads_view(project(wk, "k", kv_heads * head), kv_heads, "k")
        v = heads_view(project(wv, "v", kv_heads * head), kv_heads, "v")

    positions = node("Range", [past, total, scalar1], "positions")  # past .. past + seq
    if rotary:
        elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
        pos = node("Cast", [node("Unsqueeze", [positions, const("ax02", np.array([0, 2], np.int64))], "pos_u")], "pos_f", to=elem)
        freqs = node("Mul", [pos, inv_freq], "freqs")  # [1, seq, head / 2]
        emb = node("Concat", [freqs, freqs], "emb", axis=-1)
        cos = node("Unsqueeze", [node("Cos", [emb], "cos"), one_d["1"]], "cos_u")
        sin = node("Unsqueeze", [node("Sin", [emb], "sin"), one_d["1"]], "sin_u")

        def rotate(x: str, name: str) -> str:
            x1 = node("Slice", [x, one_d["0"], one_d["half"], one_d["3"], one_d["1"]], f"{name}_x1")
            x2 = node("Slice", [x, one_d["half"], one_d["big"], one_d["3"], one_d["1"]], f"{name}_x2")
            rot = node("Concat", [node("Neg", [x2], f"{name}_neg"), x1], f"{name}_rot", axis=-1)
            return node("Add", [node("Mul", [x, cos], f"{name}_xc"), node("Mul", [rot, sin], f"{name}_rs")], f"{name}_rope")

        q, k = rotate(q, "q"), rotate(k, "k")

    present_k = node("Concat", ["past_key", k], "present_key", axis=-2)
    present_v = node("Concat", ["past_value", v], "present_value", axis=-2)

    def repeat_kv(x: str, name: str) -> str:
        if repeat == "none":
            return x
        if repeat == "tile":
            return node("Tile", [x, const(f"{name}_reps", np.array([1, group, 1, 1], np.int64))], f"{name}_rep")
        axis = 2 if repeat == "expand" else 1
        u = node("Unsqueeze", [x, one_d[str(axis)]], f"{name}_u")
        dims = [batch_1d, one_d["kv"], one_d["group"], total_1d, one_d["head"]] if axis == 2 else \
            [batch_1d, one_d["group"], one_d["kv"], total_1d, one_d["head"]]
        e = node("Expand", [u, node("Concat", dims, f"{name}_eshape", axis=0)], f"{name}_e")
        shape = node("Concat", [batch_1d, one_d["heads"], total_1d, one_d["head"]], f"{name}_rshape", axis=0)
        return node("Reshape", [e, shape], f"{name}_rep")

    k_rep, v_rep = repeat_kv(present_k, "k"), repeat_kv(present_v, "v")
    quarter = const("quarter", np.array(head ** -0.25, dtype))
    scores = node("MatMul", [node("Mul", [q, quarter], "q_s"),
                             node("Mul", [node("Transpose", [k_rep], "k_tr", perm=[0, 1, 3, 2]), quarter], "k_s")], "scores")
    if mask in ("causal_padding", "causal", "padding"):
        kv_range = node("Range", [scalar0, total, scalar1], "kv_pos")
        kv_pos = node("Unsqueeze", [kv_range, const("ax012", np.array([0, 1, 2], np.int64))], "kv_pos_u")
        q_pos = node("Unsqueeze", [positions, const("ax013", np.array([0, 1, 3], np.int64))], "q_pos_u")
        causal = node("LessOrEqual", [kv_pos, q_pos], "causal")  # [1, 1, seq, total]
        if window:
            width = (const("window", np.array(window, np.int64)) if isinstance(window, int)
                     else node("Squeeze", [node("Shape", ["past_key"], "window_1d", start=2, end=3)], "window"))
            slide = node("Greater", [kv_pos, node("Sub", [q_pos, width], "q_minus_window")], "slide")
            causal = node("And", [causal, slide], "causal_window")
        # the mask read at each key position, as transformers' padding_mask_function indexes it
        if mask in ("causal_padding", "padding"):
            mask_at = node("Gather", [node("Cast", ["attention_mask"], "mask_b", to=TensorProto.BOOL), kv_range], "mask_at", axis=1)
            padding = node("Unsqueeze", [mask_at, const("ax12", np.array([1, 2], np.int64))], "padding")  # [batch, 1, 1, total]
        keep = {"causal_padding": lambda: node("And", [causal, padding], "keep"), "causal": lambda: causal,
                "padding": lambda: node("Expand", [padding, node("Shape", [causal], "causal_shape")], "keep")}[mask]()
        full = node("Concat", [batch_1d, one_d["1"], seq_1d, total_1d], "mask_shape", axis=0)
        keep = node("Expand", [keep, full], "keep_full")
        bias = node("Where", [keep, const("zero", np.array(0, dtype)), const("fill", np.array(np.finfo(dtype).min, dtype))], "bias")
        scores = node("Add", [scores, bias], "masked")
    probs = node("Softmax", [scores], "probs", axis=-1)
    attn = node("MatMul", [probs, v_rep], "attn")
    merged = node("Reshape", [node("Transpose", [attn], "attn_t", perm=[0, 2, 1, 3]),
                              node("Concat", [batch_1d, seq_1d, one_d["m1"]], "merge_shape", axis=0)], "attn_m")
    node("MatMul", [merged, wo], "out")

    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    inputs = [
        helper.make_tensor_value_info("hidden", elem, ["batch", "seq", hidden]),
        helper.make_tensor_value_info("attention_mask", I64, ["batch", "total"]),
        helper.make_tensor_value_info("past_key", elem, ["batch", kv_heads, "past", head]),
        helper.make_tensor_value_info("past_value", elem, ["batch", kv_heads, "past", head]),
    ]
    if mask not in ("causal_padding", "padding"):
        inputs.pop(1)
    outputs = [helper.make_tensor_value_info("out", elem, ["batch", "seq", hidden]),
               helper.make_tensor_value_info("present_key", elem, ["batch", kv_heads, "total", head]),
               helper.make_tensor_value_info("present_value", elem, ["batch", kv_heads, "total", head])]
    graph = helper.make_graph(nodes, "decoder_block", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10)
    onnx.checker.check_model(model)
    return model


def feeds(model: onnx.ModelProto, batch: int, seq: int, past: int, left_pad: int = 0, seed: int = 1) -> dict[str, np.ndarray]:
    """Inputs for one step: `past` cached tokens, `seq` new ones; the last row's first `left_pad`
    positions padded (as transformers pads decoder batches: on the left)."""
    rng = np.random.default_rng(seed)
    shapes = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input}
    hidden, kv_heads, head = shapes["hidden"][2], shapes["past_key"][1], shapes["past_key"][3]
    out = {
        "hidden": rng.standard_normal((batch, seq, hidden)).astype(np.float32),
        "past_key": rng.standard_normal((batch, kv_heads, past, head)).astype(np.float32),
        "past_value": rng.standard_normal((batch, kv_heads, past, head)).astype(np.float32),
    }
    if "attention_mask" in shapes:
        mask = np.ones((batch, past + seq), np.int64)
        mask[-1, :left_pad] = 0
        out["attention_mask"] = mask
    return out
