"""Golden tests for rotary.pdll: x * cos + rotate(x) * sin (rotate_half or rotate_every_two)
-> graphopt.RotaryEmbedding (com.microsoft.RotaryEmbedding on onnxruntime) or, at opset 23 on
plain ONNX, the standard RotaryEmbedding; negative cases; tiny LLaMA / GPT-J exports."""

from __future__ import annotations

import importlib.util
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from rule_testing import TensorProto, assert_same_outputs, helper, init, make_model, optimize_with, rewrites

F = TensorProto.FLOAT
MS = "com.microsoft"
H = 8  # head dim
N = 3  # heads
BIG = np.iinfo(np.int64).max
RULES = ["FuseRotaryEmbedding"]


def _i64(*v: int) -> np.ndarray:
    return np.array(v, np.int64)


def rotary_model(
    form: str = "half",
    layout: str = "bnsh",
    batch: str = "one",
    opset: int = 17,
    swap: bool = False,
    split: tuple[int, int] = (H // 2, H // 2),
    sign_on_first: bool = False,
    angles: str = "same",
    cos_const: bool = False,
    partial: int | None = None,
    rot_escapes: bool = False,
) -> onnx.ModelProto:
    """y = x * cos + rotate(x) * sin with cos / sin computed from position values the way
    transformers' rotary modules export (inv_freq product, Concat or repeat, Cos / Sin, Unsqueeze)."""
    nodes, inits = [], [init("inv_freq", (1.0 / 10000 ** (np.arange(0, H, 2) / H)).astype(np.float32))]
    rot_dim = partial or H
    if partial:
        inits[0] = init("inv_freq", (1.0 / 10000 ** (np.arange(0, rot_dim, 2) / rot_dim)).astype(np.float32))
    # freqs [Bc, S, half]
    inits += [init("ax2", _i64(2)), init("ax1", _i64(1)), init("axl", _i64(-1)), init("axlast", _i64(-1))]
    nodes += [helper.make_node("Unsqueeze", ["pos", "ax2"], ["pos3"]), helper.make_node("Mul", ["pos3", "inv_freq"], ["freqs"])]
    if angles == "differ":  # cat(f, 2 f): the halves differ, not a rotation by half-width angles
        inits.append(init("two", np.array(2.0, np.float32)))
        nodes += [helper.make_node("Mul", ["freqs", "two"], ["freqs2"]), helper.make_node("Concat", ["freqs", "freqs2"], ["emb"], axis=-1)]
    elif form == "half":
        nodes.append(helper.make_node("Concat", ["freqs", "freqs"], ["emb"], axis=-1))
    else:  # repeat_interleave(freqs, 2, -1): Unsqueeze, Expand [.., 2], Reshape
        inits += [init("ax3", _i64(3)), init("rep", _i64(1, 1, 1, 2)), init("flat", _i64(0, 0, rot_dim))]
        nodes += [
            helper.make_node("Unsqueeze", ["freqs", "ax3"], ["fu"]),
            helper.make_node("Expand", ["fu", "rep"], ["fe"]),
            helper.make_node("Reshape", ["fe", "flat"], ["emb"]),
        ]
    nodes += [helper.make_node("Cos", ["emb"], ["cos3"]), helper.make_node("Sin", ["emb"], ["sin3"])]
    heads_axis = "ax1" if layout == "bnsh" else "ax2"
    nodes += [helper.make_node("Unsqueeze", ["cos3", heads_axis], ["cos"]), helper.make_node("Unsqueeze", ["sin3", heads_axis], ["sin"])]
    cos, sin = ("sin", "cos") if swap else ("cos", "sin")
    x = "x"
    if partial:
        inits += [init("z", _i64(0)), init("r", _i64(rot_dim)), init("end", _i64(BIG))]
        nodes += [helper.make_node("Slice", ["x", "z", "r", "axl"], ["xr"]), helper.make_node("Slice", ["x", "r", "end", "axl"], ["xp"])]
        x = "xr"
    if form == "half":
        a, b = split
        inits += [init("s0", _i64(0)), init("s1", _i64(a)), init("s2", _i64(a + b if a + b < rot_dim else BIG))]
        nodes += [helper.make_node("Slice", [x, "s0", "s1", "axl"], ["x1"]), helper.make_node("Slice", [x, "s1", "s2", "axl"], ["x2"])]
        if sign_on_first:  # cat(-x1, x2): not a rotation
            nodes += [helper.make_node("Neg", ["x1"], ["nx"]), helper.make_node("Concat", ["nx", "x2"], ["rot"], axis=-1)]
        else:
            nodes += [helper.make_node("Neg", ["x2"], ["nx"]), helper.make_node("Concat", ["nx", "x1"], ["rot"], axis=-1)]
    else:
        inits += [init("s0", _i64(0)), init("s1", _i64(1)), init("end", _i64(BIG)), init("st2", _i64(2)), init("shape", _i64(0, 0, 0, rot_dim))]
        nodes += [
            helper.make_node("Slice", [x, "s0", "end", "axl", "st2"], ["x1"]),
            helper.make_node("Slice", [x, "s1", "end", "axl", "st2"], ["x2"]),
            helper.make_node("Neg", ["x2"], ["nx"]),
            helper.make_node("Unsqueeze", ["nx", "axlast"], ["nxu"]),
            helper.make_node("Unsqueeze", ["x1", "axlast"], ["x1u"]),
            helper.make_node("Concat", ["nxu", "x1u"], ["stack"], axis=-1),
            helper.make_node("Reshape", ["stack", "shape"], ["rot"]),
        ]
    out = "y" if not partial else "yr"
    nodes += [
        helper.make_node("Mul", [x, cos], ["xc"]),
        helper.make_node("Mul", ["rot", sin], ["rs"]),
        helper.make_node("Add", ["xc", "rs"], [out]),
    ]
    if partial:
        nodes.append(helper.make_node("Concat", ["yr", "xp"], ["y"], axis=-1))
    if cos_const:  # precomputed caches: cos / sin are constants [1, 1, S, H]
        pos = np.arange(5, dtype=np.float32)[None, :, None] * (1.0 / 10000 ** (np.arange(0, H, 2) / H)).astype(np.float32)
        emb = np.concatenate([pos, pos], -1) if angles == "same" else np.concatenate([pos, 2 * pos], -1)
        nodes = [n for n in nodes if "pos" not in n.input and n.output[0] not in ("freqs", "emb", "cos3", "sin3", "cos", "sin", "freqs2")]
        inits = [i for i in inits if i.name != "inv_freq"]
        inits += [init("cos", np.cos(emb)[:, None].astype(np.float32)), init("sin", np.sin(emb)[:, None].astype(np.float32))]
    x_shape = ["B", N, "S", H] if layout == "bnsh" else ["B", "S", N, H]
    if cos_const:
        x_shape = [2, N, 5, H]
    inputs = [helper.make_tensor_value_info("x", F, x_shape)]
    if not cos_const:
        inputs.append(helper.make_tensor_value_info("pos", F, [1 if batch == "one" else "B", "S"]))
    outputs = [helper.make_tensor_value_info("y", F, None)]
    if rot_escapes:
        outputs.append(helper.make_tensor_value_info("rot", F, None))
    model = make_model(nodes, inputs, outputs, inits, opset=opset)
    if opset >= 23:
        model.ir_version = 11
    return model


def _ops(model: onnx.ModelProto) -> Counter:
    return Counter((n.domain, n.op_type) for n in model.graph.node)


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _rotary_node(model: onnx.ModelProto, domain: str = MS) -> onnx.NodeProto:
    (node,) = [n for n in model.graph.node if n.op_type == "RotaryEmbedding" and n.domain == domain]
    return node


# Which of FuseRotaryEmbedding's replacements applied, by the ops it added (None: none applied).
_ADDED = {
    "bnsh": lambda added: "graphopt.RotaryEmbedding" in added and "Range" not in added and "Shape" not in added,
    "bsnh": lambda added: "graphopt.RotaryEmbedding" in added and "Shape" in added and "Range" not in added,
    "batched": lambda added: "graphopt.RotaryEmbedding" in added and "Range" in added,
    "standard": lambda added: "RotaryEmbedding" in added and "Expand" in added,
}


def _only(report, replacement: str | None) -> None:
    records = report.rules["FuseRotaryEmbedding"].rewrites if "FuseRotaryEmbedding" in report.rules else []
    assert len(records) == (replacement is not None)
    if replacement is not None:
        assert _ADDED[replacement](records[0].added), records[0].added


SHAPES = {"x": (2, N, 5, H), "pos": (1, 5)}
SHAPES_BSNH = {"x": (2, 5, N, H), "pos": (1, 5)}
SHAPES_BATCH = {"x": (2, N, 5, H), "pos": (2, 5)}


# --- onnxruntime: com.microsoft.RotaryEmbedding -----------------------------------


@pytest.mark.parametrize("form", ["half", "interleaved"])
def test_rotary_becomes_contrib_rotary_embedding_on_ort_cpu(form: str) -> None:
    model = rotary_model(form)
    optimized, report = optimize_with(model, RULES, target="ort-cpu")
    _only(report, "bnsh")
    node = _rotary_node(optimized)
    assert _attrs(node) == {"interleaved": int(form == "interleaved")}
    assert node.input[0] == "x" and len(node.input) == 4
    # the rotation (2 Slices, Neg, Concat [+ 2 Unsqueezes, Reshape], 2 Muls, Add) is gone; 2 Slices + 2 Reshapes cut the caches
    ops = _ops(optimized)
    assert ops[("", "Neg")] == 0 and ops[("", "Add")] == 0 and ops[("", "Mul")] == 1  # the inv_freq product stays
    assert ops[("", "Slice")] == 2 and ops[("", "Reshape")] == 2 + (form == "interleaved")
    assert_same_outputs(model, optimized, shapes=SHAPES, rtol=1e-4, atol=1e-5)


def test_rotary_on_ort_cuda_emits_the_contrib_op() -> None:
    optimized, report = optimize_with(rotary_model(), RULES, target="ort-cuda")
    _only(report, "bnsh")
    assert _ops(optimized)[(MS, "RotaryEmbedding")] == 1


@pytest.mark.parametrize("form", ["half", "interleaved"])
def test_rotary_on_batch_seq_heads_layout_is_reshaped_around_the_op(form: str) -> None:
    model = rotary_model(form, layout="bsnh")
    optimized, report = optimize_with(model, RULES, target="ort-cpu")
    _only(report, "bsnh")
    node = _rotary_node(optimized)
    producer = {o: n for n in optimized.graph.node for o in n.output}[node.input[0]]
    assert producer.op_type == "Reshape" and producer.input[0] == "x"
    assert_same_outputs(model, optimized, shapes=SHAPES_BSNH, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("form", ["half", "interleaved"])
def test_rotary_with_positions_per_batch_row_gets_computed_position_ids(form: str) -> None:
    model = rotary_model(form, batch="batch")
    optimized, report = optimize_with(model, RULES, target="ort-cpu")
    _only(report, "batched")
    assert _ops(optimized)[("", "Range")] == 1
    assert_same_outputs(model, optimized, shapes=SHAPES_BATCH, rtol=1e-4, atol=1e-5)


def test_rotary_with_constant_caches_fuses() -> None:
    model = rotary_model(cos_const=True)
    optimized, report = optimize_with(model, RULES, target="ort-cpu")
    _only(report, "bnsh")
    assert_same_outputs(model, optimized, rtol=1e-4, atol=1e-5)


def test_partial_rotary_fuses_the_rotated_slice_and_keeps_the_pass_through() -> None:
    # GPT-NeoX: rotate the first rotary_dim values of each head, concatenate the rest
    model = rotary_model(partial=4, split=(2, 2))
    optimized, report = optimize_with(model, RULES, target="ort-cpu")
    _only(report, "bnsh")
    node = _rotary_node(optimized)
    assert node.input[0] == "xr"
    assert _ops(optimized)[("", "Concat")] == 2  # cat(freqs, freqs) for the caches, and the pass-through
    assert_same_outputs(model, optimized, shapes=SHAPES, rtol=1e-4, atol=1e-5)


# --- plain ONNX: RotaryEmbedding at opset 23 ----------------------------------------


@pytest.mark.parametrize("batch", ["one", "batch"])
@pytest.mark.parametrize("form", ["half", "interleaved"])
def test_rotary_at_opset_23_becomes_standard_rotary_embedding(form: str, batch: str) -> None:
    model = rotary_model(form, batch=batch, opset=23)
    optimized, report = optimize_with(model, RULES, target="onnx")
    _only(report, "standard")
    node = _rotary_node(optimized, domain="")
    assert _attrs(node) == {"interleaved": int(form == "interleaved")}
    assert len(node.input) == 3  # no position ids: 3-D caches [batch, seq, head / 2]
    onnx.checker.check_model(optimized, full_check=True)
    assert_same_outputs(model, optimized, shapes=SHAPES if batch == "one" else SHAPES_BATCH, rtol=1e-4, atol=1e-5)


def test_rotary_at_opset_23_on_ort_cpu_prefers_the_contrib_op() -> None:
    model = rotary_model(opset=23)
    optimized, report = optimize_with(model, RULES, target="ort-cpu")
    _only(report, "bnsh")
    assert_same_outputs(model, optimized, shapes=SHAPES, rtol=1e-4, atol=1e-5)


def test_rotary_below_opset_23_is_not_fused_for_plain_onnx() -> None:
    model = rotary_model()
    optimized, report = optimize_with(model, RULES, target="onnx")
    _only(report, None)
    assert len(optimized.graph.node) == len(model.graph.node)
    reasons = [m.reason for m in report.rules["FuseRotaryEmbedding"].near_misses]
    assert any("no lowering for graphopt.RotaryEmbedding" in r for r in reasons)  # the first replacement
    assert any("opset is 17" in r for r in reasons)  # the standard one


def test_rotary_on_batch_seq_heads_layout_is_not_fused_for_plain_onnx() -> None:
    model = rotary_model(layout="bsnh", opset=23)
    optimized, report = optimize_with(model, RULES, target="onnx")
    _only(report, None)
    assert any("layout" in m.reason for m in report.rules["FuseRotaryEmbedding"].near_misses)


# --- negative cases ------------------------------------------------------------------


def _not_fused(model: onnx.ModelProto, reason: str, target: str = "ort-cpu", rule: str = "FuseRotaryEmbedding") -> None:
    optimized, report = optimize_with(model, RULES, target=target)
    _only(report, None)
    assert len(optimized.graph.node) == len(model.graph.node)
    assert reason in report.rules[rule].near_misses[0].reason, report.rules[rule].near_misses[0].reason


def test_rotary_with_a_wrong_slice_split_is_not_fused() -> None:
    _not_fused(rotary_model(split=(3, 5)), "the first Slice takes [0:3] of the last axis (8), not the first half [0:4]")


def test_rotate_half_with_the_sign_on_the_wrong_half_is_not_fused() -> None:
    _not_fused(rotary_model(sign_on_first=True), "the first Slice takes [4:8]")


def test_rotary_with_cos_and_sin_swapped_is_not_fused() -> None:
    _not_fused(rotary_model(swap=True), "cos and sin are swapped")


@pytest.mark.parametrize("form", ["half", "interleaved"])
def test_rotary_whose_cos_halves_differ_is_not_fused(form: str) -> None:
    # cat(f, 2 f): cos is not one half-width angle set repeated, so no half-width cache carries it
    _not_fused(rotary_model(form, angles="differ"), "is not known to be")


def test_rotary_with_constant_caches_whose_halves_differ_is_not_fused() -> None:
    _not_fused(rotary_model(cos_const=True, angles="differ"), "the constant cos's halves differ")


def test_rotary_whose_rotated_half_has_another_user_is_not_fused() -> None:
    model = rotary_model(rot_escapes=True)
    optimized, report = optimize_with(model, RULES, target="ort-cpu")
    _only(report, None)
    assert len(optimized.graph.node) == len(model.graph.node)


# --- end to end: tiny LLaMA (both exporters), tiny GPT-J (dynamo) -------------------


def _models():
    name = "graphopt_test_models"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("models.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


# 2 layers, rotary on q and k in each: 4 rotations, rotate_half on [batch, heads, seq, 16]
# with cos / sin [1, 1, seq, 16] (positions shared by the batch). Both exports are below
# opset 23 (dynamo 20, TorchScript 17): nothing for plain ONNX.
@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
@pytest.mark.parametrize("target", ["ort-cpu", "onnx"])
def test_tiny_llama_rotary_fusions(exporter: str, target: str) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import graphopt
    from graphopt.verify import verify

    models = _models()
    if not hasattr(models, "llama_tiny"):
        pytest.skip("tests/models.py has no llama_tiny")
    source = models.llama_tiny(exporter)
    optimized, report = graphopt.optimize(onnx.load(source), target=target)
    counts = {r: rewrites(report, r) for r in RULES}
    ops = _ops(optimized)
    if target == "ort-cpu":
        assert counts == {"FuseRotaryEmbedding": 4}
        assert all("Shape" not in r.added and "Range" not in r.added for r in report.rules["FuseRotaryEmbedding"].rewrites)
        assert ops[(MS, "RotaryEmbedding")] == 4 and ops[("", "Neg")] == 0
    else:
        assert counts == dict.fromkeys(RULES, 0)
        assert ops[("", "Neg")] == 4
    result = verify(source, optimized)
    assert result.passed, result.message


@pytest.fixture(scope="module")
def tiny_gptj(tmp_path_factory) -> Path:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPTJConfig(n_embd=64, n_head=4, n_layer=1, rotary_dim=8, vocab_size=1000, n_positions=128,
                                     bos_token_id=0, eos_token_id=0)
    config._attn_implementation = "eager"
    model = transformers.GPTJForCausalLM(config).eval()

    class Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, ids):
            return self.model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).logits

    path = tmp_path_factory.mktemp("gptj") / "gptj.onnx"
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq")
    program = torch.onnx.export(Logits(), (torch.randint(0, 1000, (1, 8)),), dynamo=True, input_names=["input_ids"],
                                output_names=["logits"], dynamic_shapes={"ids": {0: batch, 1: seq}}, verbose=False)
    program.save(str(path), external_data=False)
    return path


# GPT-J: rotate_every_two (interleaved) on [batch, seq, heads, rotary_dim 8 of head 16] before
# the heads move: q and k of the one layer, each a partial rotary.
@pytest.mark.filterwarnings("ignore")
def test_tiny_gptj_interleaved_rotary_fuses_on_ort_cpu(tiny_gptj: Path) -> None:
    import graphopt
    from graphopt.verify import verify

    optimized, report = graphopt.optimize(onnx.load(tiny_gptj), target="ort-cpu")
    assert rewrites(report, "FuseRotaryEmbedding") == 2
    assert all("Shape" in r.added for r in report.rules["FuseRotaryEmbedding"].rewrites)  # the [batch, seq, heads, head] replacement
    nodes = [n for n in optimized.graph.node if n.op_type == "RotaryEmbedding"]
    assert len(nodes) == 2 and all(_attrs(n) == {"interleaved": 1} for n in nodes)
    result = verify(tiny_gptj, optimized)
    assert result.passed, result.message
