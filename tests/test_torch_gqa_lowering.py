"""graphopt.GroupQueryAttention on torch (graphopt/ops/torch_fused.py): ATen ops only, checked
against onnxruntime's com.microsoft.GroupQueryAttention (the op's meaning) on the CPU, with and
without rotary inside, with a padding attention_bias, several new tokens over a past at batch 2."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper

from graphopt.ops.fx_builder import FxBuilder
from graphopt.ops.torch_lowering import GRAPHOPT, torch_target
from graphopt.pattern.native import RewriteDeclined

B, N, KV, H, S, P = 2, 4, 2, 16, 3, 5
T = P + S


def _inputs(rotary: bool, bias: bool) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    f = np.float32
    feeds = {
        "query": rng.standard_normal((B, S, N * H)).astype(f),
        "key": rng.standard_normal((B, S, KV * H)).astype(f),
        "value": rng.standard_normal((B, S, KV * H)).astype(f),
        "past_key": rng.standard_normal((B, KV, P, H)).astype(f),
        "past_value": rng.standard_normal((B, KV, P, H)).astype(f),
        "seqlens_k": np.full((B,), T - 1, np.int32),
        "total_sequence_length": np.array(T, np.int32),
    }
    if rotary:  # caches of T rows (positions 0 .. T - 1), read at past + s
        angles = np.outer(np.arange(T), 1.0 / 10000 ** (np.arange(0, H, 2) / H))
        feeds["cos_cache"], feeds["sin_cache"] = np.cos(angles).astype(f), np.sin(angles).astype(f)
    if bias:  # batch row 1 left-padded by 2 past positions: every query still sees a key
        attention_bias = np.zeros((B, 1, S, T), f)
        attention_bias[1, :, :, :2] = np.finfo(f).min
        feeds["attention_bias"] = attention_bias
    feeds["query_seqlens"] = np.full((B,), S, np.int32)
    return feeds


_ORDER = ["query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length", "cos_cache", "sin_cache",
          "position_ids", "attention_bias", "head_sink", "k_scale", "v_scale", "q_norm_weight", "k_norm_weight", "query_seqlens"]


def _attrs(rotary: bool, interleaved: bool) -> dict[str, Any]:
    return {"num_heads": N, "kv_num_heads": KV, "scale": H ** -0.5, "do_rotary": int(rotary), "rotary_interleaved": int(interleaved)}


def _onnxruntime(feeds: dict[str, np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
    elem = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.int32): TensorProto.INT32}
    inputs = [helper.make_tensor_value_info(n, elem[a.dtype], a.shape) for n, a in feeds.items()]
    node = helper.make_node("GroupQueryAttention", [n if n in feeds else "" for n in _ORDER], ["out", "present_key", "present_value"],
                            domain="com.microsoft", **attrs)
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("out", "present_key", "present_value")]
    model = helper.make_model(helper.make_graph([node], "gqa", inputs, outputs),
                              opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _torch(feeds: dict[str, np.ndarray], attrs: dict[str, Any]) -> list[torch.Tensor]:
    args = [torch.from_numpy(feeds[n]) if n in feeds else None for n in _ORDER]
    eager = FxBuilder(None, None, evaluate=True)  # runs the lowering's ATen calls on the tensors themselves
    with torch.no_grad():
        return GRAPHOPT["GroupQueryAttention"].fn(eager, args, dict(attrs), {0, 1, 2})


@pytest.mark.parametrize("rotary,interleaved,bias", [(False, False, False), (False, False, True), (True, False, False),
                                                     (True, True, True)])
def test_the_torch_lowering_computes_what_onnxruntimes_kernel_computes(rotary: bool, interleaved: bool, bias: bool) -> None:
    feeds, attrs = _inputs(rotary, bias), _attrs(rotary, interleaved)
    expected, actual = _onnxruntime(feeds, attrs), _torch(feeds, attrs)
    for name, e, a in zip(("out", "present_key", "present_value"), expected, actual, strict=True):
        np.testing.assert_allclose(a.numpy(), e, rtol=1e-5, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("interleaved", [False, True])
def test_a_partial_rotary_rotates_the_first_dims_as_onnxruntime_does(interleaved: bool) -> None:
    """Phi-4-mini's partial rotary in the op: caches [rows, 8] on heads of 32 rotate the first 16 dims of each
    head and pass the other 16 through (onnxruntime: the caches' width <= head / 2, a multiple of 8)."""
    head, width = 32, 8
    rng = np.random.default_rng(1)
    feeds = {k: v for k, v in _inputs(False, False).items()}
    for name, heads in (("query", N), ("key", KV), ("value", KV)):
        feeds[name] = rng.standard_normal((B, S, heads * head)).astype(np.float32)
    for name in ("past_key", "past_value"):
        feeds[name] = rng.standard_normal((B, KV, P, head)).astype(np.float32)
    angles = np.outer(np.arange(T), 1.0 / 10000 ** (np.arange(0, 2 * width, 2) / (2 * width)))
    feeds = {k: feeds[k] for k in _ORDER[:7]} | {"cos_cache": np.cos(angles).astype(np.float32),
                                                 "sin_cache": np.sin(angles).astype(np.float32), "query_seqlens": feeds["query_seqlens"]}
    attrs = _attrs(True, interleaved) | {"scale": head ** -0.5}
    expected, actual = _onnxruntime(feeds, attrs), _torch(feeds, attrs)
    for name, e, a in zip(("out", "present_key", "present_value"), expected, actual, strict=True):
        np.testing.assert_allclose(a.numpy(), e, rtol=1e-5, atol=1e-5, err_msg=name)
    new_keys = actual[1][:, :, P:].numpy()
    plain = feeds["key"].reshape(B, S, KV, head).transpose(0, 2, 1, 3)
    np.testing.assert_array_equal(new_keys[..., 2 * width:], plain[..., 2 * width:])  # passed through
    assert not np.allclose(new_keys[..., : 2 * width], plain[..., : 2 * width], atol=1e-3)  # rotated


def test_the_rotary_really_rotates() -> None:
    """Guards the comparison above: the same inputs without do_rotary give another output."""
    feeds = _inputs(True, False)
    rotated, plain = _torch(feeds, _attrs(True, False)), _torch(feeds, _attrs(False, False))
    assert not torch.allclose(rotated[0], plain[0], atol=1e-3)
    assert not torch.allclose(rotated[1], plain[1], atol=1e-3)  # the present key holds the rotated new keys


def test_it_lowers_to_aten_ops_in_every_kernel_policy() -> None:
    """No custom op (which would cut inductor's fusions in the default mode): the lowering is
    offered with kernels "none" (inductor's default mode) and "inductor" alike."""
    assert GRAPHOPT["GroupQueryAttention"].custom_ops == ()
    for kernels in ("all", "inductor", "none"):
        assert "GroupQueryAttention" in torch_target(kernels=kernels).lowerings, kernels


@pytest.mark.parametrize("window", [2, 4, 20])
def test_a_local_window_attends_as_onnxruntime_does(window: int) -> None:
    """local_window_size (Mistral's sliding window): each query sees the last `window` keys up to its own; 20 covers
    the whole cache (the same as none)."""
    feeds, attrs = _inputs(True, False), {**_attrs(True, False), "local_window_size": window}
    expected, actual = _onnxruntime(feeds, attrs), _torch(feeds, attrs)
    for name, e, a in zip(("out", "present_key", "present_value"), expected, actual, strict=True):
        np.testing.assert_allclose(a.numpy(), e, rtol=1e-5, atol=1e-5, err_msg=name)
    whole = _torch(feeds, _attrs(True, False))[0]
    assert torch.allclose(actual[0], whole, atol=1e-6) == (window >= T)


def test_a_zero_window_is_declined() -> None:
    feeds = _inputs(False, False)
    with pytest.raises(RewriteDeclined, match="causal"):
        _torch(feeds, {**_attrs(False, False), "local_window_size": 0})

