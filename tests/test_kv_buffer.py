"""graphopt.passes.kv_buffer (--kv-buffer shared): GroupQueryAttention's past and present as one
max-length buffer bound to both with io-binding (onnxruntime's past_present_share_buffer), the past
length read from an attention_mask. Decoded in onnxruntime's CPU provider over a prefill and several
one-token steps: every step's output equals the export's with a growing cache, and the buffer's valid
prefix equals the export's presents; counts; the reasons it is refused; the ort-cuda contract."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from llm_decoders import decoder_block

import graphopt
from graphopt.ops.fused_ops import shared_kv_buffer
from graphopt.ops.opspec import GRAPHOPT_DOMAIN
from graphopt.ops.targets import TARGETS
from graphopt.passes.kv_buffer import PAST_LENGTH, PRESENT_LENGTH, share_kv_buffer

GQA = "com.microsoft.GroupQueryAttention"
GROWS = "onnxruntime's CUDA attention over a KV cache that grows each call"
MAX_LENGTH = 16


def _ops(model: onnx.ModelProto) -> Counter[str]:
    return Counter(f"{n.domain}.{n.op_type}" if n.domain else n.op_type for n in model.graph.node)


def _decode(model: onnx.ModelProto, seqs: tuple[int, ...], batch: int, shared: bool, seed: int = 5,
            static: bool = False) -> tuple[list[np.ndarray], dict[str, np.ndarray]]:
    """Each step's first output, and the caches' valid part after the last step. New tokens from a
    seeded generator (hidden states or token ids); shared: one MAX_LENGTH buffer per past/present
    pair, bound as both; else each step's presents are the next step's past. static: the mask
    [batch, MAX_LENGTH], ones over the valid tokens and zeros after (the shapes CUDA graphs need),
    after a prompt-length mask for the first call (the prefill, as onnxruntime-genai runs it)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # graphopt's graph, not ORT's
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    inputs = {i.name: i for i in session.get_inputs()}
    outputs = [o.name for o in session.get_outputs()]
    pasts = [n for n in inputs if n.startswith("past")]
    presents = {p: "present" + p[len("past"):] for p in pasts}
    meta = inputs[pasts[0]]
    kv_heads, head = meta.shape[1], meta.shape[3]
    float_type = np.float16 if "float16" in meta.type else np.float32
    length = MAX_LENGTH if shared else 0
    cache = {p: ort.OrtValue.ortvalue_from_numpy(np.zeros((batch, kv_heads, length, head), float_type)) for p in pasts}
    rng = np.random.default_rng(seed)
    results, total = [], 0
    for seq in seqs:
        total += seq
        binding = session.io_binding()
        if "input_ids" in inputs:
            binding.bind_cpu_input("input_ids", rng.integers(0, 97, (batch, seq)).astype(np.int64))
        else:
            hidden = inputs["hidden"].shape[2]
            binding.bind_cpu_input("hidden", rng.standard_normal((batch, seq, hidden)).astype(float_type))
        if "attention_mask" in inputs:
            mask = np.ones((batch, total), np.int64)
            if static and total > seq:
                mask = np.zeros((batch, MAX_LENGTH), np.int64)
                mask[:, :total] = 1
            binding.bind_cpu_input("attention_mask", mask)
        for past in pasts:
            binding.bind_ortvalue_input(past, cache[past])
        by_present = {presents[p]: cache[p] for p in pasts} if shared else {}
        for name in outputs:
            if name in by_present:
                binding.bind_ortvalue_output(name, by_present[name])
            else:
                binding.bind_output(name, "cpu")
        session.run_with_iobinding(binding)
        values = dict(zip(outputs, binding.get_outputs(), strict=True))
        results.append(np.array(values[outputs[0]].numpy()))
        if shared:
            assert values[presents[pasts[0]]].data_ptr() == cache[pasts[0]].data_ptr()  # written in place
        else:
            cache = {p: values[presents[p]] for p in pasts}
    # copies: numpy() of an OrtValue on a numpy buffer does not keep that buffer alive
    return results, {p: np.array(cache[p].numpy()[:, :, :total]) for p in pasts}


def _assert_same_decode(original: onnx.ModelProto, optimized: onnx.ModelProto, seqs: tuple[int, ...], batch: int, atol: float = 1e-5) -> None:
    expected, expected_cache = _decode(original, seqs, batch, shared=False)
    for shared, static in ((False, False), (True, False), (True, True)):  # the rewritten model runs every way
        actual, actual_cache = _decode(optimized, seqs, batch, shared=shared, static=static)
        for step, (e, a) in enumerate(zip(expected, actual, strict=True)):
            np.testing.assert_allclose(a, e, rtol=1e-4, atol=atol, err_msg=f"step {step}, shared {shared}, static {static}")
        for name, e in expected_cache.items():
            np.testing.assert_allclose(actual_cache[name], e, rtol=1e-4, atol=atol, err_msg=f"{name}, shared {shared}, static {static}")


def test_golden_a_causal_block_gets_an_attention_mask_and_decodes_in_one_buffer() -> None:
    """The causal block (no attention_mask): the pass adds attention_mask [batch, total], rewrites
    the two Shape reads of the past (its length, its batch); prefill of 5 tokens at batch 2 then 4 steps in a
    16-token buffer give the export's outputs and cache."""
    model = decoder_block(mask="causal", hidden=64)
    optimized, report = graphopt.optimize(model, target="ort-cpu", kv_buffer="shared")
    assert report.rules["FuseGroupQueryAttention"].applications == 1
    assert report.pass_stats("kv_buffer").changes == 2
    assert not [w for w in report.warnings if "kv-buffer" in w]
    assert [i.name for i in optimized.graph.input] == ["hidden", "past_key", "past_value", "attention_mask"]
    assert _ops(optimized)[GQA] == 1
    assert not any(n.op_type == "Shape" and n.input[0] == "past_key" and n.attribute[0].i == 2 for n in optimized.graph.node)
    present = {o.name: [d.dim_param or d.dim_value for d in o.type.tensor_type.shape.dim] for o in optimized.graph.output}
    assert present["present_key"][2] == PRESENT_LENGTH
    _assert_same_decode(model, optimized, (5, 1, 1, 1, 1), batch=2)


def test_a_padding_mask_input_is_read_for_the_past_length() -> None:
    """With its own attention_mask (causal and padding: GroupQueryAttention takes attention_bias on
    the CPU) no input is added; all-ones masks decode the same in the buffer."""
    model = decoder_block(mask="causal_padding", hidden=64)
    optimized, report = graphopt.optimize(model, target="ort-cpu", kv_buffer="shared")
    assert report.pass_stats("kv_buffer").changes == 2
    assert [i.name for i in optimized.graph.input] == [i.name for i in model.graph.input]
    _assert_same_decode(model, optimized, (4, 1, 1, 1), batch=2)


def test_growing_is_the_default_and_leaves_the_shapes_alone() -> None:
    model = decoder_block(mask="causal", hidden=64)
    optimized, report = graphopt.optimize(model, target="ort-cpu")
    assert report.pass_stats("kv_buffer").runs == 0
    assert [i.name for i in optimized.graph.input] == ["hidden", "past_key", "past_value"]
    assert any(n.op_type == "Shape" and n.input[0] == "past_key" for n in optimized.graph.node)
    with pytest.raises(ValueError, match="kv_buffer must be one of growing, shared"):
        graphopt.optimize(model, target="ort-cpu", kv_buffer="static")


def test_tiny_llama_export_decodes_in_shared_buffers() -> None:
    """The dynamo export of a 2-layer LLaMA with a DynamicCache (input_ids, attention_mask): both
    layers' pasts read through the mask; prefill of 6 tokens at batch 2 and 4 steps in the buffers
    equal the export's growing cache."""
    pytest.importorskip("transformers")
    from architectures import build

    path, _ = build("smollm-kv", "dynamo")
    model = onnx.load(str(path))
    optimized, report = graphopt.optimize(model, target="ort-cpu", kv_buffer="shared")
    assert report.rules["FuseGroupQueryAttention"].applications == 2
    assert report.pass_stats("kv_buffer").changes >= 2  # every past_k<i>'s length read
    assert _ops(optimized)[GQA] == 2
    # one seqlens_k, total_sequence_length and query_seqlens for both layers, from the mask
    gqas = [n for n in optimized.graph.node if n.op_type == "GroupQueryAttention"]
    assert gqas[0].input[5] == gqas[1].input[5] == "kv_buffer_seqlens_k"
    assert gqas[0].input[6] == gqas[1].input[6] == "kv_buffer_total_sequence_length"
    producers = {o: n for n in optimized.graph.node for o in n.output}
    # the builder's forms: seqlens_k from the mask's row sums (on the device), the total from its shape
    assert producers[producers["kv_buffer_seqlens_k"].input[0]].op_type == "Sub"
    assert producers[producers[producers["kv_buffer_seqlens_k"].input[0]].input[0]].op_type == "ReduceSum"
    assert producers[producers["kv_buffer_total_sequence_length"].input[0]].op_type == "Gather"
    # the rotary caches: tables of every position, made on the device, reading no past length (this
    # export's attention_bias still does: its causal half, which a one-token step does not need)
    assert gqas[0].input[7] == gqas[1].input[7] and _ops(optimized)["Pad"] == 0
    for cache in gqas[0].input[7:9]:
        ops, values = set(), set()
        stack = [cache]
        while stack:
            node = producers.get(stack.pop())
            if node is not None and node.name not in ops:
                ops.add(node.name)
                values.update(node.input)
                stack.extend(node.input)
        kinds = {n.op_type for n in optimized.graph.node if n.name in ops}
        assert {"ConstantOfShape", "CumSum", "Cos" if cache == gqas[0].input[7] else "Sin"} <= kinds and not kinds & {"Range", "Pad"}
        assert PAST_LENGTH not in values and "attention_mask" in values and "input_ids" not in values
    _assert_same_decode(model, optimized, (6, 1, 1, 1, 1), batch=2, atol=2e-5)


@pytest.mark.parametrize(("start", "delta", "device_form"), [(0, 1, True), (2, 1, False), (0, 2, False)])
def test_range_on_the_device(start: int, delta: int, device_form: bool) -> None:
    """Range(0, n, 1) of the rotary tables as CumSum(ConstantOfShape([n], 1), exclusive): equal to
    np.arange for several n; another start or step is left as Range (None)."""
    import onnx_ir as ir

    from graphopt.passes.kv_buffer import _device_range

    h = onnx.helper
    graph = h.make_graph([h.make_node("Range", ["start", "n", "delta"], ["positions"], name="range")], "g",
                         [h.make_tensor_value_info("n", onnx.TensorProto.INT64, [])],
                         [h.make_tensor_value_info("positions", onnx.TensorProto.INT64, ["count"])],
                         [onnx.numpy_helper.from_array(np.array(start, np.int64), "start"),
                          onnx.numpy_helper.from_array(np.array(delta, np.int64), "delta")])
    model = ir.serde.deserialize_model(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]))
    node = next(iter(model.graph))
    made = _device_range(model.graph, node, list(node.inputs))
    if not device_form:
        assert made is None
        return
    assert made is not None and [n.op_type for n in made] == ["Reshape", "ConstantOfShape", "CumSum"]
    model.graph.insert_after(node, made)
    node.outputs[0].replace_all_uses_with(made[-1].outputs[0], replace_graph_outputs=True)
    model.graph.remove(node, safe=True)
    session = ort.InferenceSession(ir.serde.serialize_model(model).SerializeToString(), providers=["CPUExecutionProvider"])
    for n in (1, 5, 512):
        np.testing.assert_array_equal(session.run(None, {"n": np.array(n, np.int64)})[0], np.arange(n))


# ----------------------------------------------------------------------------- refused


def test_negative_no_group_query_attention_leaves_the_model_and_says_why() -> None:
    """A Tile repeat stays MultiHeadAttention (no GroupQueryAttention): nothing to share, a warning."""
    model = decoder_block(repeat="tile", mask="causal", hidden=64)
    optimized, report = graphopt.optimize(model, target="ort-cpu", kv_buffer="shared")
    assert _ops(optimized)[GQA] == 0
    assert [i.name for i in optimized.graph.input] == ["hidden", "past_key", "past_value"]
    assert any("--kv-buffer shared: not applied: no com.microsoft.GroupQueryAttention" in w for w in report.warnings), report.warnings


def test_negative_a_past_read_by_another_op_is_refused() -> None:
    """A past input read by anything but GroupQueryAttention and Shape (here a ReduceSum output)
    would read the whole max-length buffer: refused, the model unchanged."""
    import onnx_ir as ir

    optimized, _ = graphopt.optimize(decoder_block(mask="causal", hidden=64), target="ort-cpu")
    extra = onnx.helper.make_node("ReduceSum", ["past_key"], ["past_sum"], name="extra")
    optimized.graph.node.append(extra)
    optimized.graph.output.append(onnx.helper.make_tensor_value_info("past_sum", onnx.TensorProto.FLOAT, None))
    model = ir.serde.deserialize_model(optimized)
    before = [n.op_type for n in model.graph]
    changed, problem = share_kv_buffer(model)
    assert changed == 0 and problem is not None and "read by ReduceSum extra" in problem
    assert [n.op_type for n in model.graph] == before and len(model.graph.inputs) == 3


def test_negative_a_cast_between_the_input_and_the_cache_is_refused() -> None:
    """--precision fp16 of a float32 model keeps float32 inputs: the cache reaches GroupQueryAttention
    through a Cast, which a buffer bound as the past cannot be written through."""
    model = decoder_block(mask="causal", hidden=64)
    optimized, report = graphopt.optimize(model, target="ort-cpu", kv_buffer="shared", precision="fp16")
    assert _ops(optimized)[GQA] == 1
    assert any("not applied" in w and "is not a graph input" in w for w in report.warnings), report.warnings


# ----------------------------------------------------------------------------- ort-cuda


def test_ort_cuda_emits_group_query_attention_for_a_shared_buffer() -> None:
    """The growing cache is what made GroupQueryAttention slow on CUDA; with --kv-buffer shared a
    float16 block gets it (and the pass), without it stays unfused as before."""
    model = decoder_block(mask="causal", hidden=64, dtype=np.float16)
    shared, report = graphopt.optimize(model, target="ort-cuda", kv_buffer="shared")
    assert _ops(shared)[GQA] == 1 and _ops(shared)["Softmax"] == 0
    assert report.pass_stats("kv_buffer").changes == 2
    growing, _ = graphopt.optimize(model, target="ort-cuda")
    assert _ops(growing)[GQA] == 0 and _ops(growing)["Softmax"] == 1


def test_ort_cuda_contract_follows_the_shared_buffer_flag() -> None:
    cuda = TARGETS["ort-cuda"]
    shapes: list[Any] = [[1, 1, 64]] * 7
    assert (cuda.contract_problem(GRAPHOPT_DOMAIN, "GroupQueryAttention", {}, shapes) or "").startswith(GROWS)
    with shared_kv_buffer():
        assert cuda.contract_problem(GRAPHOPT_DOMAIN, "GroupQueryAttention", {}, shapes) is None
        assert cuda.contract_problem(GRAPHOPT_DOMAIN, "MultiHeadAttention", {"num_heads": 4, "kv_cache": 1}, []) is None
        # what the kernel refuses stays refused
        assert "no attention_bias" in (cuda.contract_problem(GRAPHOPT_DOMAIN, "GroupQueryAttention", {}, [*shapes, None, None, None, [1, 1, 1, 5]]) or "")
    assert (cuda.contract_problem(GRAPHOPT_DOMAIN, "GroupQueryAttention", {}, shapes) or "").startswith(GROWS)


def test_negative_without_the_pass_a_shared_buffer_reads_its_length_as_the_past() -> None:
    """What the pass is for: graphopt's growing-cache output bound to the same buffers takes the
    buffer's 16 rows for the past: present = 16 + 4 rows, which onnxruntime refuses to write into it."""
    optimized, _ = graphopt.optimize(decoder_block(mask="causal", hidden=64), target="ort-cpu")
    with pytest.raises(Exception, match=r"has shape \{1,2,16,16\} but the computed output shape for this run is \{1,2,20,16\}"):
        _decode(optimized, (4, 1, 1), batch=1, shared=True)


def test_cli_kv_buffer(tmp_path) -> None:
    """--kv-buffer shared on the command line; an unknown mode is one error line and exit 2."""
    from conftest import run_cli

    source = tmp_path / "block.onnx"
    onnx.save(decoder_block(mask="causal", hidden=64), str(source))
    done = run_cli("optimize", source, tmp_path / "o.onnx", "--target", "ort-cpu", "--kv-buffer", "shared", "-q")
    assert done.returncode == 0, done.stderr
    assert [i.name for i in onnx.load(str(tmp_path / "o.onnx")).graph.input][-1] == "attention_mask"
    bad = run_cli("optimize", source, tmp_path / "x.onnx", "--target", "ort-cpu", "--kv-buffer", "static")
    assert bad.returncode == 2 and bad.stderr.strip() == "error: unknown --kv-buffer 'static' (known: growing, shared)"


def test_a_max_length_makes_the_rotary_tables_constants() -> None:
    """kv_max_length: the tables for positions 0 .. N - 1 folded into initializers (the builder's caches):
    no table node runs per step, and the decode equals the export's (prefill, then one-token steps)."""
    pytest.importorskip("transformers")
    from architectures import build

    path, _ = build("smollm-kv", "dynamo")
    model = onnx.load(str(path))
    per_step, _ = graphopt.optimize(model, target="ort-cpu", kv_buffer="shared")
    optimized, report = graphopt.optimize(model, target="ort-cpu", kv_buffer="shared", kv_max_length=MAX_LENGTH)
    assert report.rules["FuseGroupQueryAttention"].applications == 2 and not report.warnings
    gqas = [n for n in optimized.graph.node if n.op_type == "GroupQueryAttention"]
    initializers = {i.name: i for i in optimized.graph.initializer}
    for name in gqas[0].input[7:9]:  # cos and sin caches: [N, head / 2] constants
        assert name in initializers, name
        assert list(initializers[name].dims) == [MAX_LENGTH, 8], initializers[name].dims  # head 16 (smollm-kv)
    ops, before = _ops(optimized), _ops(per_step)
    assert {"Cos", "Sin", "CumSum", "ConstantOfShape"} <= set(before)
    assert not {"Cos", "Sin", "CumSum", "ConstantOfShape"} & set(ops)
    assert sum(ops.values()) <= sum(before.values()) - 8  # the table's nodes gone
    _assert_same_decode(model, optimized, (6, 1, 1, 1, 1), batch=2, atol=2e-5)


def test_negative_a_max_length_needs_the_shared_buffer() -> None:
    model = decoder_block(mask="causal", hidden=64)
    with pytest.raises(ValueError, match="kv_max_length takes a length >= 1 with kv_buffer='shared'"):
        graphopt.optimize(model, target="ort-cpu", kv_max_length=64)
    with pytest.raises(ValueError, match="kv_max_length takes a length >= 1"):
        graphopt.optimize(model, target="ort-cpu", kv_buffer="shared", kv_max_length=0)


def test_cli_kv_max_length(tmp_path) -> None:
    from conftest import run_cli

    source = tmp_path / "block.onnx"
    onnx.save(decoder_block(mask="causal", hidden=64), str(source))
    done = run_cli("optimize", source, tmp_path / "o.onnx", "--target", "ort-cpu", "--kv-buffer", "shared", "--kv-max-length", "32", "-q")
    assert done.returncode == 0, done.stderr
    bad = run_cli("optimize", source, tmp_path / "x.onnx", "--target", "ort-cpu", "--kv-max-length", "32")
    assert bad.returncode == 2 and bad.stderr.strip() == "error: --kv-max-length takes a length >= 1, with --kv-buffer shared"
    assert not (tmp_path / "x.onnx").exists()


def test_a_sequence_past_the_max_length_is_refused_not_wrong(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tables of 8 positions in a 16-row buffer: the step whose total passes 8 fails in onnxruntime (its
    GroupQueryAttention checks the cache's rows), it does not read past the table."""
    pytest.importorskip("transformers")
    from architectures import build

    path, _ = build("smollm-kv", "dynamo")
    optimized, _ = graphopt.optimize(onnx.load(str(path)), target="ort-cpu", kv_buffer="shared", kv_max_length=8)
    monkeypatch.setitem(globals(), "MAX_LENGTH", 16)
    _decode(optimized, (6, 1, 1), batch=2, shared=True)  # totals 6, 7, 8: inside the tables
    with pytest.raises(Exception, match="cos_cache dimension 0 shall not be less than total_sequence_length"):
        _decode(optimized, (6, 1, 1, 1), batch=2, shared=True)  # total 9
