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


@pytest.mark.parametrize("name", sorted(models.TINY_MODELS))
def test_tiny_model_builds_loads_and_runs(name: str) -> None:
    path = models.TINY_MODELS[name]()
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
