"""graphopt.quant.blockwise: packing round-trips, dequantization, and the MatMulNBits layout."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graphopt.quant.blockwise import dequantize, pack, pack_zero_points, quantize, snr_db, unpack


@settings(max_examples=30, deadline=None)
@given(bits=st.sampled_from([4, 8]), rows=st.integers(1, 5), cols=st.integers(1, 8).map(lambda c: 2 * c))
def test_pack_unpack_round_trip(bits: int, rows: int, cols: int) -> None:
    q = np.random.default_rng(rows * cols).integers(0, 1 << bits, size=(rows, cols), dtype=np.uint8)
    packed = pack(q, bits)
    assert packed.shape[-1] == cols * bits // 8
    assert np.array_equal(unpack(packed, bits), q)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("symmetric", [True, False])
def test_quantize_dequantize_within_half_a_step(bits: int, symmetric: bool) -> None:
    w = np.random.default_rng(0).standard_normal((100, 24)).astype(np.float32)  # K=100 is padded to 4 blocks of 32
    q = quantize(w, bits, 32, symmetric)
    assert q.q.shape == (24, 4, 32) and q.scales.shape == (24, 4)
    assert int(q.q.max()) <= (1 << bits) - 1
    error = np.abs(dequantize(q) - w)
    step = np.repeat(q.scales.T.astype(np.float32), 32, axis=0)[:100]
    assert np.all(error <= step / 2 + 1e-6)
    assert snr_db(w, dequantize(q)) > (18 if bits == 4 else 40)


def test_symmetric_uses_the_default_zero_point() -> None:
    q = quantize(np.linspace(-1, 1, 64, dtype=np.float32).reshape(32, 2), 4, 32)
    assert np.all(q.zero_points == 8)


def test_int4_zero_points_pack_two_blocks_a_byte() -> None:
    zp = np.array([[1, 2, 3]], dtype=np.uint8)
    assert pack_zero_points(zp, 4).tolist() == [[0x21, 0x03]]


def test_layout_matches_onnxruntime_matmulnbits() -> None:
    ort = pytest.importorskip("onnxruntime")
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(1)
    k, n, block = 100, 24, 32
    w = rng.standard_normal((k, n)).astype(np.float32)
    x = rng.standard_normal((3, k)).astype(np.float32)
    q = quantize(w, 4, block, symmetric=False)
    inits = [
        numpy_helper.from_array(pack(q.q, 4), "B"),
        numpy_helper.from_array(q.scales.reshape(-1), "S"),
        numpy_helper.from_array(pack_zero_points(q.zero_points, 4).reshape(-1), "Z"),
    ]
    node = helper.make_node("MatMulNBits", ["x", "B", "S", "Z"], ["y"], domain="com.microsoft", K=k, N=n, bits=4, block_size=block)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", 1, [3, k])], [helper.make_tensor_value_info("y", 1, [3, n])], inits
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    y = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(y, x @ dequantize(q), atol=1e-4)


def test_bad_bits_and_block_size_are_refused() -> None:
    w = np.ones((32, 2), dtype=np.float32)
    with pytest.raises(ValueError, match="bits"):
        quantize(w, 3)
    with pytest.raises(ValueError, match="block size"):
        quantize(w, 4, 24)
