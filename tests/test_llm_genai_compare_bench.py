"""benchmarks/llm_genai_compare.py's static-buffer decode (ort_static_decode.py) on the CPU provider:
the greedy-token output it adds to a model, the decode over fixed buffers against the io-binding
decode and eager torch, and the -cg variants' refusal without CUDA (their GPU run:
`bash benchmarks/gpu_session.sh genai-cg`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from ort_static_decode import NEXT_TOKEN, summarize_placement_log, with_next_token  # noqa: E402


def test_next_token_is_the_last_positions_argmax_and_shares_the_weights(tmp_path: Path) -> None:
    """logits = x @ W with W in an external data file: the copy with next_token reads the same file
    (nothing rewritten) and gives the argmax of the last position's logits, first index on ties."""
    h = onnx.helper
    weight = np.random.default_rng(0).standard_normal((8, 50)).astype(np.float32)
    graph = h.make_graph([h.make_node("MatMul", ["x", "w"], ["logits"])], "g",
                         [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", "seq", 8])],
                         [h.make_tensor_value_info("logits", onnx.TensorProto.FLOAT, ["batch", "seq", 50])],
                         [onnx.numpy_helper.from_array(weight, "w")])
    source = tmp_path / "model.onnx"
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]), str(source), save_as_external_data=True,
              location="model.onnx.data", size_threshold=0)
    target = with_next_token(source)
    assert target == tmp_path / "model-next-token.onnx" and sorted(p.name for p in tmp_path.iterdir()) == [
        "model-next-token.onnx", "model.onnx", "model.onnx.data"]
    assert target.stat().st_size < 2000  # the weights stay in model.onnx.data
    session = ort.InferenceSession(str(target), providers=["CPUExecutionProvider"])
    assert [o.name for o in session.get_outputs()] == ["logits", NEXT_TOKEN]
    x = np.random.default_rng(1).standard_normal((3, 5, 8)).astype(np.float32)
    x[2, -1] = 0  # all-zero logits: a tie everywhere, index 0 as numpy's
    logits, token = session.run(None, {"x": x})
    assert token.shape == (3, 1) and token.dtype == np.int64
    np.testing.assert_array_equal(token[:, 0], (x[:, -1] @ weight).argmax(-1))
    assert token[2, 0] == 0 and np.array_equal(logits, x @ weight)
    assert with_next_token(source) == target  # made once


def test_cuda_graph_variants_need_cuda(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, "benchmarks/llm_genai_compare.py", "--out", str(tmp_path), "--variants", "graphopt-static,graphopt-cg"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert run.returncode == 2 and run.stderr.startswith("error: ") and "-cg variants need --device cuda" in run.stderr
    assert run.stderr.strip().count("\n") == 0 and not (tmp_path / "work").exists()


def test_static_decode_equals_the_io_binding_decode_and_eager(tmp_path: Path) -> None:
    """A 1-layer LLaMA (the script's small shape), exported and optimized with --kv-buffer shared,
    decoded greedily on the CPU with every buffer bound once (a [1, 32] mask updated in place, the
    token an ArgMax output) gives the io-binding decode's tokens and eager fp32's."""
    pytest.importorskip("transformers")
    steps = 8
    run = subprocess.run([sys.executable, "benchmarks/llm_genai_compare.py", "--out", str(tmp_path), "--layers", "1", "--variants",
                          "graphopt-shared,graphopt-static", "--steps", str(steps), "--prompt", "12", "--rounds", "2", "--warmup", "1",
                          "--max-length", "32", "--threads", "1"], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    record = json.loads((tmp_path / "llm_genai_compare-small-l1-fp32.json").read_text())
    rows = {r["variant"]: r for r in record["results"]}
    assert set(rows) == {"graphopt-shared", "graphopt-static"}, rows
    assert rows["graphopt-static"]["tokens"] == rows["graphopt-shared"]["tokens"]
    assert rows["graphopt-static"]["agree"] == rows["graphopt-shared"]["agree"] == steps
    assert "graphopt-static" in run.stdout.splitlines()[-1]


def test_placement_log_summary() -> None:
    """What a refused capture's row says, read from onnxruntime's log lines (their format in 1.2x)."""
    log = "\n".join([
        "2026-11-28 [I:onnxruntime:, transformer_memcpy.cc:393 AddCopyNode] Add MemcpyFromHost after kv_buffer_seqlens_k for CUDAExecutionProvider",
        "2026-11-28 [W:onnxruntime:, transformer_memcpy.cc:83 ApplyImpl] 1 Memcpy nodes are added to the graph main_graph for CUDAExecutionProvider.",
        "2026-11-28 [V:onnxruntime:, session_state.cc:1345 VerifyEachNodeIsAssignedToAnEp]  Node(s) placed on [CUDAExecutionProvider]. Number of nodes: 2",
        "2026-11-28 [V:onnxruntime:, session_state.cc:1347 VerifyEachNodeIsAssignedToAnEp]   MatMul (m)",
        "2026-11-28 [V:onnxruntime:, session_state.cc:1345 VerifyEachNodeIsAssignedToAnEp]  Node(s) placed on [CPUExecutionProvider]. Number of nodes: 2",
        "2026-11-28 [V:onnxruntime:, session_state.cc:1347 VerifyEachNodeIsAssignedToAnEp]   Shape (kv_buffer_total)",
        "2026-11-28 [V:onnxruntime:, session_state.cc:1347 VerifyEachNodeIsAssignedToAnEp]   Expand (kv_buffer_last_rows)",
        "2026-11-28 [I:onnxruntime:, inference_session.cc:100 Initialize] Session successfully initialized.",
    ])
    summary = summarize_placement_log(log)
    assert summary.startswith("CPU-placed nodes (2): Shape (kv_buffer_total), Expand (kv_buffer_last_rows); copies: Add MemcpyFromHost after kv_buffer_seqlens_k")
    assert "1 Memcpy nodes are added" in summary and "MatMul" not in summary and summary.endswith("no CUDA kernel: none")
    assert summarize_placement_log("[V:onnxruntime:, x] All nodes placed on [CUDAExecutionProvider]. Number of nodes: 9").startswith(
        "CPU-placed nodes (0): ; copies: none")
