"""torch.ops.graphopt.*: registration, the CPU reference's semantics, torch.library.opcheck,
bad input, the CUDA path as the compiler sees it, and life without triton.

The Triton kernels themselves are checked in tests/test_kernels_triton.py (interpreter)
and tests/test_kernels_compile.py (compiled for sm_90).
"""

import logging
import math
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import graphopt.kernels  # noqa: F401  (registers the ops)

REPO = Path(__file__).resolve().parent.parent
ops = torch.ops.graphopt
F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32


def rand(*shape: int, dtype: torch.dtype = F32, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def test_schemas_are_the_agreed_ones() -> None:
    want = {
        "attention": "graphopt::attention(Tensor q, Tensor k, Tensor v, Tensor? attn_mask=None, bool is_causal=False, float? scale=None) -> Tensor",
        "linear_act": 'graphopt::linear_act(Tensor x, Tensor w, Tensor? bias=None, str activation="none") -> Tensor',
        "layer_norm": "graphopt::layer_norm(Tensor x, Tensor? residual, Tensor weight, Tensor? bias, float eps) -> (Tensor, Tensor)",
        "rms_norm": "graphopt::rms_norm(Tensor x, Tensor? residual, Tensor weight, float eps) -> (Tensor, Tensor)",
        "swiglu": "graphopt::swiglu(Tensor gate, Tensor up) -> Tensor",
        "geglu": "graphopt::geglu(Tensor gate, Tensor up, bool approximate=False) -> Tensor",
        "rotary": "graphopt::rotary(Tensor x, Tensor cos, Tensor sin, bool interleaved=False) -> Tensor",
    }
    for name, schema in want.items():
        assert str(getattr(ops, name).default._schema) == schema


# --- opcheck: schema, fake kernel, autograd registration, AOT dispatch with dynamic shapes ----


def _mask(*shape: int) -> torch.Tensor:
    m = torch.rand(*shape, generator=torch.Generator().manual_seed(3)) > 0.3
    m[..., 0] = True
    return m


OPCHECK_CASES: dict[str, tuple[Any, tuple, dict]] = {
    "attention_mha": (ops.attention, (rand(2, 4, 5, 8), rand(2, 4, 7, 8), rand(2, 4, 7, 8)), {}),
    "attention_gqa_causal_bool_mask": (ops.attention, (rand(2, 4, 5, 8), rand(2, 2, 7, 8), rand(2, 2, 7, 8), _mask(5, 7)), {"is_causal": True}),
    "attention_mqa_additive_scale_fp16": (
        ops.attention, (rand(1, 4, 6, 16, dtype=F16), rand(1, 1, 6, 16, dtype=F16), rand(1, 1, 6, 16, dtype=F16), rand(1, 1, 1, 6)), {"scale": 0.3},
    ),
    "linear_act_gelu_3d": (ops.linear_act, (rand(2, 3, 8), rand(8, 6), rand(6), "gelu"), {}),
    "linear_act_silu_no_bias_bf16": (ops.linear_act, (rand(5, 8, dtype=BF16), rand(8, 6, dtype=BF16)), {"activation": "silu"}),
    "layer_norm_residual_bias": (ops.layer_norm, (rand(2, 3, 8), rand(2, 3, 8), rand(8), rand(8), 1e-5), {}),
    "layer_norm_plain_fp16": (ops.layer_norm, (rand(4, 8, dtype=F16), None, rand(8, dtype=F16), None, 1e-5), {}),
    "rms_norm_residual": (ops.rms_norm, (rand(3, 8), rand(3, 8), rand(8), 1e-6), {}),
    "rms_norm_plain_bf16": (ops.rms_norm, (rand(2, 2, 8, dtype=BF16), None, rand(8, dtype=BF16), 1e-6), {}),
    "swiglu": (ops.swiglu, (rand(3, 10), rand(3, 10)), {}),
    "geglu_tanh_fp16": (ops.geglu, (rand(3, 10, dtype=F16), rand(3, 10, dtype=F16)), {"approximate": True}),
    "rotary_half": (ops.rotary, (rand(2, 3, 5, 8), rand(1, 5, 8), rand(1, 5, 8)), {}),
    "rotary_partial_interleaved": (ops.rotary, (rand(2, 3, 5, 12), rand(2, 5, 8), rand(2, 5, 8)), {"interleaved": True}),
}


@pytest.mark.parametrize("case", sorted(OPCHECK_CASES))
def test_opcheck(case: str) -> None:
    op, args, kwargs = OPCHECK_CASES[case]
    result = torch.library.opcheck(op.default, args, kwargs)
    assert set(result.values()) == {"SUCCESS"}, result


# --- the CPU reference's semantics ------------------------------------------------------------


def naive_attention(q, k, v, mask=None, is_causal=False, scale=None):  # type: ignore[no-untyped-def]
    """Written out in fp64; a row with nothing to attend to gives zeros."""
    q, k, v = q.double(), k.double(), v.double()
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = q @ k.transpose(-1, -2) * (scale if scale is not None else 1 / math.sqrt(q.shape[-1]))
    allowed = torch.ones_like(scores, dtype=torch.bool)
    if is_causal:
        allowed = allowed & torch.ones(q.shape[2], k.shape[2], dtype=torch.bool).tril()
    if mask is not None:
        allowed = allowed & mask if mask.dtype == torch.bool else allowed
        scores = scores + mask.double() if mask.dtype != torch.bool else scores
    return torch.softmax(scores.masked_fill(~allowed, float("-inf")), -1).nan_to_num(0.0) @ v


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mask_kind", [None, "bool", "additive"])
def test_attention_reference_semantics(causal: bool, mask_kind: str | None) -> None:
    q, k, v = rand(2, 6, 5, 8, seed=1), rand(2, 2, 9, 8, seed=2), rand(2, 2, 9, 12, seed=3)  # GQA, Dv != D
    mask = None
    if mask_kind == "bool":
        mask = _mask(2, 1, 5, 9)
        mask[1, 0, 2] = False  # a row that attends to nothing
    elif mask_kind == "additive":
        mask = rand(5, 9, seed=4)
    got = ops.attention(q, k, v, mask, causal)
    torch.testing.assert_close(got, naive_attention(q, k, v, mask, causal).float(), atol=1e-5, rtol=1e-5)
    if mask_kind == "bool":
        assert got[1, :, 2].abs().max() == 0


def test_linear_act_matches_torch_ops() -> None:
    x, w, b = rand(2, 3, 8, seed=1), rand(8, 6, seed=2), rand(6, seed=3)
    y = F.linear(x, w.t(), b)
    for name, want in {"none": y, "relu": F.relu(y), "gelu": F.gelu(y), "gelu_tanh": F.gelu(y, approximate="tanh"), "silu": F.silu(y)}.items():
        torch.testing.assert_close(ops.linear_act(x, w, b, name), want)


def test_norms_match_torch_ops() -> None:
    x, r, w, b = rand(3, 4, 16, dtype=F16, seed=1), rand(3, 4, 16, dtype=F16, seed=2), rand(16, dtype=F16, seed=3), rand(16, dtype=F16, seed=4)
    out, s = ops.layer_norm(x, r, w, b, 1e-5)
    assert torch.equal(s, x + r) and out.dtype == F16
    torch.testing.assert_close(out, F.layer_norm((x + r).float(), (16,), w.float(), b.float(), 1e-5).half())
    out, s = ops.rms_norm(x, None, w, 1e-6)
    assert torch.equal(s, x) and s.data_ptr() != x.data_ptr()  # outputs never alias inputs
    sf = x.float()
    torch.testing.assert_close(out, (sf * torch.rsqrt(sf.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()).half())


def test_gates_and_rotary_match_formulas() -> None:
    g, u = rand(4, 10, seed=1), rand(4, 10, seed=2)
    torch.testing.assert_close(ops.swiglu(g, u), F.silu(g) * u)
    torch.testing.assert_close(ops.geglu(g, u), F.gelu(g) * u)
    torch.testing.assert_close(ops.geglu(g, u, True), F.gelu(g, approximate="tanh") * u)
    x, cos, sin = rand(1, 2, 3, 8, seed=3), rand(1, 3, 4, seed=4), rand(1, 3, 4, seed=5)
    c, s = cos.unsqueeze(1), sin.unsqueeze(1)
    x1, x2, rest = x[..., :2], x[..., 2:4], x[..., 4:]
    want = torch.cat((x[..., :4] * c + torch.cat((-x2, x1), -1) * s, rest), -1)
    torch.testing.assert_close(ops.rotary(x, cos, sin), want)
    pairs = torch.stack((-x[..., 1:4:2], x[..., 0:4:2]), -1).flatten(-2)
    torch.testing.assert_close(ops.rotary(x, cos, sin, True), torch.cat((x[..., :4] * c + pairs * s, rest), -1))


# --- bad input: clear messages ------------------------------------------------------------------


BAD_INPUT: dict[str, tuple[Callable[[], Any], type[Exception], str]] = {
    "attention_heads": (lambda: ops.attention(rand(1, 3, 4, 8), rand(1, 2, 4, 8), rand(1, 2, 4, 8)), RuntimeError, "multiple of key/value heads"),
    "attention_mask_shape": (lambda: ops.attention(rand(1, 2, 4, 8), rand(1, 2, 5, 8), rand(1, 2, 5, 8), rand(4, 4)), RuntimeError, "does not broadcast"),
    "attention_rank": (lambda: ops.attention(rand(2, 4, 8), rand(2, 4, 8), rand(2, 4, 8)), RuntimeError, "must be 4-D"),
    "linear_act_activation": (lambda: ops.linear_act(rand(2, 8), rand(8, 4), None, "tanh"), ValueError, "unknown activation 'tanh'"),
    "linear_act_k": (lambda: ops.linear_act(rand(2, 8), rand(7, 4)), RuntimeError, "disagree on K"),
    "layer_norm_weight": (lambda: ops.layer_norm(rand(2, 8), None, rand(7), None, 1e-5), RuntimeError, "weight (7,) must be [N]"),
    "rms_norm_residual": (lambda: ops.rms_norm(rand(2, 8), rand(2, 9), rand(8), 1e-5), RuntimeError, "residual"),
    "swiglu_shapes": (lambda: ops.swiglu(rand(2, 8), rand(2, 9)), RuntimeError, "must share shape"),
    "rotary_odd_dim": (lambda: ops.rotary(rand(1, 2, 3, 8), rand(1, 3, 5), rand(1, 3, 5)), RuntimeError, "must be even"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUT))
def test_bad_input_is_named(case: str) -> None:
    call, error, text = BAD_INPUT[case]
    with pytest.raises(error, match=text.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        call()


# --- the CUDA path as torch.compile sees it -----------------------------------------------------


CUDA_CALLS: dict[str, Callable[[], Any]] = {
    "attention": lambda: ops.attention(*[torch.empty(2, 4, 64, 64, device="cuda", dtype=F16)] * 3, None, True),
    "linear_act": lambda: ops.linear_act(torch.empty(8, 64, device="cuda", dtype=F16), torch.empty(64, 32, device="cuda", dtype=F16), None, "gelu"),
    "layer_norm": lambda: ops.layer_norm(*[torch.empty(8, 64, device="cuda", dtype=F16)] * 2, *[torch.empty(64, device="cuda", dtype=F16)] * 2, 1e-5),
    "rms_norm": lambda: ops.rms_norm(torch.empty(8, 64, device="cuda", dtype=F16), None, torch.empty(64, device="cuda", dtype=F16), 1e-5),
    "swiglu": lambda: ops.swiglu(*[torch.empty(8, 64, device="cuda", dtype=F16)] * 2),
    "geglu": lambda: ops.geglu(*[torch.empty(8, 64, device="cuda", dtype=F16)] * 2, True),
    "rotary": lambda: ops.rotary(torch.empty(1, 2, 8, 64, device="cuda", dtype=F16), *[torch.empty(1, 8, 64, device="cuda")] * 2),
}


class _GraphCaptured(Exception):
    pass


@pytest.mark.parametrize("name", sorted(CUDA_CALLS))
def test_cuda_path_exposes_the_triton_kernel_to_the_compiler(name: str) -> None:
    """AOT dispatch over fake CUDA tensors (no GPU needed) decomposes the triton_op: the
    graph that inductor would get holds the Triton kernel itself, not an opaque op."""
    from torch._functorch.aot_autograd import aot_function
    from torch._subclasses.fake_tensor import FakeTensorMode

    captured: list[str] = []

    def compiler(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        captured.append(gm.code)
        raise _GraphCaptured

    # without a GPU, torch's mutation analysis of the kernel logs a traceback and assumes
    # every argument mutated; harmless here, so keep the log quiet
    quiet = logging.getLogger("torch._higher_order_ops.triton_kernel_wrap")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)
    try:
        with FakeTensorMode():
            call = CUDA_CALLS[name]
            with pytest.raises(_GraphCaptured):
                aot_function(lambda dummy: call(), fw_compiler=compiler)(torch.empty(1, device="cuda"))
    finally:
        quiet.setLevel(level)
    assert captured and "triton_kernel_wrapper_functional" in captured[0], captured
    assert "graphopt" not in captured[0]


def test_torch_compile_on_cpu_with_dynamic_shapes() -> None:
    """On CPU the ops decompose to their reference: torch.compile (AOT, dynamic shapes) runs them."""

    def block(x: torch.Tensor, w: torch.Tensor, gamma: torch.Tensor) -> torch.Tensor:
        h = ops.linear_act(x, w, None, "silu")
        q = h.view(h.shape[0], h.shape[1], 2, 8).transpose(1, 2)
        a = ops.attention(q, q, q, None, True)
        out, _ = ops.rms_norm(a.transpose(1, 2).reshape(h.shape), h, gamma, 1e-6)
        return out

    compiled = torch.compile(block, backend="aot_eager", dynamic=True, fullgraph=True)
    w, gamma = rand(16, 16, seed=1), rand(16, seed=2)
    for seq in (5, 9):
        x = rand(2, seq, 16, seed=seq)
        torch.testing.assert_close(compiled(x, w, gamma), block(x, w, gamma))


# --- without triton -------------------------------------------------------------------------------


def test_ops_register_and_run_without_triton() -> None:
    code = (
        "import sys; sys.modules['triton'] = None\n"  # makes `import triton` fail
        "import graphopt, torch, graphopt.kernels as k\n"
        "assert not k.HAS_TRITON\n"
        "q = torch.randn(1, 2, 4, 8)\n"
        "out = torch.ops.graphopt.attention(q, q, q, None, True)\n"
        "assert torch.allclose(out, torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True), atol=1e-6)\n"
        "print('ok')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]
