"""The tiny test models build, load in onnxruntime and run (seconds, cached in .cache/models)."""

from __future__ import annotations

import importlib.util
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")
from onnx import numpy_helper  # noqa: E402


def _load_models_module():  # tests/ may or may not be a package: import the file itself
    name = "graphopt_test_models"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("models.py"))
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


models = _load_models_module()


def _session(path: Path):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


ALL_TINY = {**models.TINY_MODELS, **models.ZOO}


@pytest.mark.parametrize("name", sorted(ALL_TINY))
def test_tiny_model_builds_loads_and_runs(name: str) -> None:
    path = ALL_TINY[name]()
    assert path.is_file()
    meta = models.load_meta(path)
    assert meta["check"]["export_shape"]["ok"], meta["check"]
    # every tiny model exports with dynamic axes and agrees with torch at other sizes too
    assert meta["dynamic"], meta["dynamic_error"]
    assert meta["check"]["other_shape"]["ok"], meta["check"]
    assert meta["external_data"] == meta["exporter"].startswith("dynamo")

    sess = _session(path)
    assert [i.name for i in sess.get_inputs()] == [i["name"] for i in meta["inputs"]]
    for dims in ({}, {"batch": 2} | ({"seq": 11} if "seq" in meta["dims"] else {})):
        feeds = models.example_inputs(path, **dims)
        outs = sess.run(None, feeds)
        assert len(outs) == len(meta["outputs"])
        batch = dims.get("batch", meta["dims"]["batch"])
        for out in outs:
            assert out.shape[0] == batch
            assert np.isfinite(out).all()


def test_small_cnn_keeps_the_patterns_fusions_need() -> None:
    proto = onnx.load(str(models.small_cnn()), load_external_data=False)
    ops = Counter(n.op_type for n in proto.graph.node)
    assert ops["BatchNormalization"] == 4, ops  # Conv, grouped Conv, depthwise Conv, ConvTranspose
    assert ops["ConvTranspose"] == 1 and ops["Pad"] >= 1 and ops["MatMul"] == 1, ops
    groups = sorted(a.i for n in proto.graph.node if n.op_type == "Conv" for a in n.attribute if a.name == "group" and a.i > 1)
    assert groups == [4, 32], groups  # the grouped and the depthwise Conv


def test_dynamo_export_folds_what_the_noopt_export_keeps() -> None:
    """The dynamo exporter's own optimizer folds BN and Pad into Conv (a quirk the builders document)."""
    proto = onnx.load(str(models.small_cnn("dynamo")), load_external_data=False)
    ops = Counter(n.op_type for n in proto.graph.node)
    assert ops["BatchNormalization"] == 0 and ops["Pad"] == 0, ops


def test_builds_are_deterministic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = onnx.load(str(models.small_cnn("torchscript")))
    monkeypatch.setattr(models, "CACHE_DIR", tmp_path)
    again = onnx.load(str(models.small_cnn("torchscript")))
    assert str(tmp_path) in str(models.small_cnn("torchscript"))
    a = {t.name: numpy_helper.to_array(t) for t in first.graph.initializer}
    b = {t.name: numpy_helper.to_array(t) for t in again.graph.initializer}
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])


def test_example_inputs_are_deterministic_and_pad_the_last_row() -> None:
    path = models.bert_tiny("torchscript")
    x, y = models.example_inputs(path, batch=2, seq=8), models.example_inputs(path, batch=2, seq=8)
    for k in x:
        np.testing.assert_array_equal(x[k], y[k])
    assert x["attention_mask"][0].all() and not x["attention_mask"][1].all()
    assert x["input_ids"].max() < 1000


def test_zoo_has_every_family_for_both_exporters() -> None:
    families = {"bert", "gpt2", "llama", "vit", "t5-encoder", "whisper-encoder", "resnet", "mobilenet"}
    for fam in families:
        for exp in ("dynamo", "torchscript"):
            assert f"{fam}-tiny-{exp}" in models.ZOO
    assert {"resnet-tiny-dynamo-noopt", "mobilenet-tiny-dynamo-noopt"} <= set(models.ZOO)
    for name in set(models.ZOO) & set(models.TINY_MODELS):  # same name, same model
        assert models.ZOO[name]() == models.TINY_MODELS[name]()


def test_attention_implementation_is_recorded() -> None:
    for name in ("llama-tiny-dynamo", "llama-tiny-torchscript", "t5-encoder-tiny-dynamo",
                 "t5-encoder-tiny-torchscript", "vit-tiny-torchscript", "whisper-encoder-tiny-dynamo"):
        path = models.ZOO[name]()
        meta = models.load_meta(path)
        family = meta["family"]
        attn = models.ATTN_IMPLEMENTATION[family][meta["exporter"]]
        assert meta["params"]["attn"] == attn
        assert meta["key"].endswith(f"-{attn}-{meta['exporter']}")


def test_llama_has_grouped_query_attention_and_rotary() -> None:
    proto = onnx.load(str(models.llama_tiny("torchscript")), load_external_data=False)
    ops = Counter(n.op_type for n in proto.graph.node)
    assert ops["Sin"] >= 1 and ops["Cos"] >= 1 and ops["Neg"] >= 2, ops  # rotary
    dims = [list(t.dims) for t in proto.graph.initializer]
    # hidden 64, 4 heads of 16, 2 kv heads: k_proj and v_proj are 64x32 MatMul weights, 2 layers
    assert dims.count([64, 32]) == 4 and dims.count([64, 64]) == 4, dims  # and q_proj, o_proj 64x64


def test_whisper_encoder_needs_twice_max_source_positions_frames() -> None:
    meta = models.load_meta(models.whisper_encoder_tiny("dynamo"))
    assert meta["inputs"][0]["shape"] == ["batch", 80, 64]
    assert meta["graph_outputs"][0]["shape"][1:] == [32, 64]


def test_mobilenet_noopt_keeps_batchnorm_and_depthwise_convs() -> None:
    proto = onnx.load(str(models.mobilenet_tiny("dynamo-noopt")), load_external_data=False)
    ops = Counter(n.op_type for n in proto.graph.node)
    assert ops["BatchNormalization"] == ops["Conv"] == 52, ops  # stem + 17 blocks (2 or 3 convs) + head
    assert ops["Clip"] == 35 and ops["Add"] >= 10, ops  # ReLU6; 10 residual Adds
    depthwise = [n for n in proto.graph.node if n.op_type == "Conv"
                 and any(a.name == "group" and a.i > 1 for a in n.attribute)]
    assert len(depthwise) == 17


def test_bench_models_have_the_benchmark_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Checked without exporting: _build returns the cache key it would use."""
    monkeypatch.setattr(models, "_build", lambda spec, exporter, opset, rebuild: spec.key(exporter, opset))
    keys = {name: fn() for name, fn in models.BENCH_MODELS.items()}
    assert keys["bert-base-b8-s128-dynamo"] == "bert-L12-H768-A12-V30522-S128-B8-dynamo"
    assert keys["gpt2-b1-s512-torchscript"] == "gpt2-L12-H768-A12-V50257-S512-B1-torchscript"
    assert keys["vit-base-b8-dynamo"] == "vit-L12-H768-A12-P16-R224-B8-sdpa-dynamo"
    assert keys["resnet50-b32-dynamo-noopt"] == "resnet50like-W64-3463-C1000-R224-B32-dynamo-noopt"
    assert keys["llama-L4-H1024-b8-s128-torchscript"] == \
        "llama-L4-H1024-A16-KV4-I2816-V32000-P2048-S128-B8-sdpa-torchscript"
    assert all(k.endswith(n.rsplit("-", 2)[-1] if n.endswith("noopt") else n.rsplit("-", 1)[-1])
               for n, k in keys.items())
