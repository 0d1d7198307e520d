"""The CPU-provider measurement tools of issue 14 on a one-model zoo cache built here:
benchmarks/ort_cpu_profile.py (per-op profiles, whether onnxruntime runs the original's graph),
zoo_bench's --control/--pin (the original timed twice, never an anchor; threads pinned) and
benchmarks/ort_session_spread.py. Figures are never asserted, only what each run records."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

ROOT = Path(__file__).resolve().parent.parent
ENV = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
NAME = "tiny-resblock"


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A zoo cache holding one residual block: Conv + BatchNormalization + Relu, Conv, Add, Relu."""
    rng = np.random.default_rng(0)
    c = 8

    def w(name: str, *shape: int) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.2).astype(np.float32), name)

    bn = [w("scale", c), w("bias", c), w("mean", c), numpy_helper.from_array(np.abs(rng.standard_normal(c)).astype(np.float32) + 0.5, "var")]
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c1", "scale", "bias", "mean", "var"], ["b1"]),
        helper.make_node("Relu", ["b1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c2", "x"], ["s"]),
        helper.make_node("Relu", ["s"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, c, 16, 16])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, c, 16, 16])],
                              [w("w1", c, c, 3, 3), w("w2", c, c, 3, 3), w("b2", c), *bn])
    root = tmp_path_factory.mktemp("zoo")
    folder = root / NAME
    folder.mkdir()
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(folder / "model.onnx"))
    np.savez(folder / "inputs.npz", x=rng.standard_normal((1, c, 16, 16)).astype(np.float32))
    (folder / "meta.json").write_text(json.dumps({"name": NAME, "status": "ok", "exporter": "onnx.helper", "opset": 17, "nodes": len(nodes)}))
    return root


def _run(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, f"benchmarks/{script}", *args], capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=300)


def test_profile_tells_which_variants_run_the_originals_graph(cache: Path, tmp_path: Path) -> None:
    run = _run("ort_cpu_profile.py", "--cache", str(cache), "--models", NAME, "--threads", "1", "--runs", "3", "--rounds", "2",
               "--rules-off", "FuseConvAddRelu", "--out", str(tmp_path))
    assert run.returncode == 0, run.stderr
    doc = json.loads((tmp_path / "ort_cpu_profile.json").read_text())
    result = doc["results"][NAME]
    variants = result["variants"]
    assert set(variants) == {"original", "graphopt", "ort-offline-all", "original-again", "graphopt-no-FuseConvAddRelu"}
    # The same file in a second session, and onnxruntime's own offline output: the original's graph.
    assert variants["original-again"]["same_graph_as_original"] and variants["ort-offline-all"]["same_graph_as_original"]
    for info in variants.values():
        profile = info["profile"]
        assert profile["runs"] >= 3 and profile["total_us"] > 0
        assert any(op.endswith("Conv") for op in profile["us_per_op"]), profile["us_per_op"]
        assert sum(info["ops_run"].values()) >= 2
    assert set(result["wall"]) == set(variants) and all(w["median_ms"] > 0 for w in result["wall"].values())
    assert "runs the original's graph" in run.stdout


def test_profile_refuses_unknown_variants_and_models(cache: Path) -> None:
    bad = _run("ort_cpu_profile.py", "--cache", str(cache), "--models", NAME, "--variants", "original,fastest")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and bad.stderr.startswith("error: unknown variants fastest")
    missing = _run("ort_cpu_profile.py", "--cache", str(cache), "--models", "no-such-model")
    assert missing.returncode == 2 and missing.stderr.startswith("error: not in the zoo cache")


def test_zoo_bench_control_is_timed_but_never_an_anchor(cache: Path, tmp_path: Path) -> None:
    out = tmp_path / "zoo.json"
    run = _run("zoo_bench.py", "--cache", str(cache), "--device", "cpu", "--threads", "1", "--runs", "3", "--rounds", "2",
               "--warmup", "1", "--remeasure", "0", "--control", "--pin", "--out", str(out))
    assert run.returncode == 0, run.stderr
    doc = json.loads(out.read_text())
    assert doc["settings"]["control"] and doc["settings"]["pin"]
    result = doc["results"][0]
    assert result["pinned"] is True
    again = result["variants"]["original-again"]
    assert again["role"] == "control" and again["median_ms"] > 0 and again["check"]["ok"]
    ratios = result["ratios"]["fp32"]
    assert ratios["control_vs_original"] == pytest.approx(again["median_ms"] / result["variants"]["original"]["median_ms"])
    assert ratios["best_anchor"] != "original-again"
    assert "control " in run.stdout


def test_session_spread_times_every_session(cache: Path, tmp_path: Path) -> None:
    run = _run("ort_session_spread.py", "--cache", str(cache), "--models", NAME, "--threads", "1", "--sessions", "3", "--rounds", "2",
               "--block-s", "0.001", "--out", str(tmp_path))
    assert run.returncode == 0, run.stderr
    rows = json.loads((tmp_path / "ort_session_spread.json").read_text())["rows"]
    assert [(r["spin"], r["pin"]) for r in rows] == [(True, False), (False, False), (True, True), (False, True)]
    assert all(len(r["median_ms"]) == 3 and r["max_over_min"] >= 1.0 for r in rows)
    assert all(r["pinned"] for r in rows if r["pin"])


def test_graphs_only_compares_without_timing(cache: Path, tmp_path: Path) -> None:
    run = _run("ort_cpu_profile.py", "--cache", str(cache), "--models", "all", "--variants", "original,original-again,graphopt",
               "--graphs-only", "--out", str(tmp_path))
    assert run.returncode == 0, run.stderr
    result = json.loads((tmp_path / "ort_cpu_profile.json").read_text())["results"][NAME]
    assert "wall" not in result and all("profile" not in v for v in result["variants"].values())
    assert result["variants"]["original-again"]["same_graph_as_original"] is True
    assert f"{NAME}" in run.stdout and "runs the original's graph: original-again" in run.stdout


def test_zoo_bench_times_one_graph_once(cache: Path, tmp_path: Path) -> None:
    """Variants that are the same graph under other value names share one runner: their ratio is 1 by
    construction and flagged '=', never a measured loss; another attribute or weight makes another graph."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import zoo_bench

    original = onnx.load(str(cache / NAME / "model.onnx"))
    renamed = onnx.load(str(cache / NAME / "model.onnx"))
    mapping = {"c1": "conv_out", "b1": "bn_out", "r1": "relu_out", "w2": "weight_2"}
    for node in renamed.graph.node:
        node.input[:] = [mapping.get(i, i) for i in node.input]
        node.output[:] = [mapping.get(o, o) for o in node.output]
    for init in renamed.graph.initializer:
        init.name = mapping.get(init.name, init.name)
    other_attr = onnx.load(str(cache / NAME / "model.onnx"))
    other_attr.graph.node[3].attribute.append(helper.make_attribute("dilations", [1, 1]))
    other_weight = onnx.load(str(cache / NAME / "model.onnx"))
    w2 = next(t for t in other_weight.graph.initializer if t.name == "w2")
    w2.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(w2) * 2, "w2"))
    paths = {}
    for name, model in (("original", original), ("renamed", renamed), ("other_attr", other_attr), ("other_weight", other_weight)):
        paths[name] = str(tmp_path / f"{name}.onnx")
        onnx.save(model, paths[name])
    fingerprint = zoo_bench.graph_fingerprint
    assert fingerprint(paths["renamed"]) == fingerprint(paths["original"])
    assert fingerprint(paths["other_attr"]) != fingerprint(paths["original"])
    assert fingerprint(paths["other_weight"]) != fingerprint(paths["original"])
    # as a kernel sees them (the executed graphs' comparison): weights by dtype and shape, attributes still count
    assert fingerprint(paths["other_weight"], weight_values=False) == fingerprint(paths["original"], weight_values=False)
    assert fingerprint(paths["other_attr"], weight_values=False) != fingerprint(paths["original"], weight_values=False)
    variants = {"original": {"path": paths["original"], "role": "original"},
                "graphopt": {"path": paths["renamed"], "role": "graphopt"},
                "original-again": {"path": paths["original"], "role": "control"},
                "onnxscript": {"path": paths["other_weight"], "role": "anchor"},
                "broken": {"role": "anchor", "precision": "fp32", "error": "no file"}}
    assert zoo_bench._same_graphs(variants) == {"graphopt": "original"}
    variants["graphopt"].update(precision="fp32", same_graph_as="original", median_ms=1.0)
    variants["original"].update(precision="fp32", median_ms=1.0)
    variants["onnxscript"].update(precision="fp32", median_ms=2.0, check={"ok": True})
    ratios = zoo_bench._ratios({"variants": variants}, "fp32")
    assert ratios["same_graph"] == ["vs_original"] and ratios["vs_best_anchor"] == 0.5


def test_zoo_bench_merges_files_that_run_as_one_graph(cache: Path, tmp_path: Path) -> None:
    """onnxruntime's own offline output is another file than the original but the same graph once a session has
    optimized it: zoo_bench times the two once (same_executed_graph); with --file-graphs-only it times both."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import onnxruntime as ort
    import zoo_bench

    original = str(cache / NAME / "model.onnx")
    offline = str(tmp_path / "offline.onnx")
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.optimized_model_filepath = offline
    ort.InferenceSession(original, options, providers=["CPUExecutionProvider"])
    assert zoo_bench.graph_fingerprint(offline) != zoo_bench.graph_fingerprint(original)
    executed = {name: zoo_bench.executed_graph_fingerprint(path, "cpu") for name, path in (("original", original), ("offline", offline))}
    assert executed["original"] is not None and executed["original"] == executed["offline"]
    variants = {"original": {"path": original, "role": "original"}, "ort-offline-all": {"path": offline, "role": "anchor"}}
    assert zoo_bench._same_graphs(variants) == {}
    assert zoo_bench._same_graphs(variants, {"original": executed["original"], "ort-offline-all": executed["offline"]}) == {
        "ort-offline-all": "original"}
    # a different executed graph is never merged
    assert zoo_bench._same_graphs(variants, {"original": executed["original"], "ort-offline-all": "other"}) == {}

    for extra, merged in (([], True), (["--file-graphs-only"], False)):
        out = tmp_path / f"zoo{len(extra)}.json"
        run = _run("zoo_bench.py", "--cache", str(cache), "--device", "cpu", "--threads", "1", "--runs", "3", "--rounds", "2",
                   "--warmup", "1", "--remeasure", "1", *extra, "--out", str(out))
        assert run.returncode == 0, run.stderr
        doc = json.loads(out.read_text())
        anchor = doc["results"][0]["variants"]["ort-offline-all"]
        assert (anchor.get("same_graph_as") == "original" and anchor.get("same_executed_graph") is True) is merged
        assert doc["settings"]["file_graphs_only"] is (not merged)
