"""graphopt/ir/fast_io.py and fast_save.py: memory-mapped loading of single-file models and saves that
reuse the input's bytes. Every test compares with onnx-ir's ordinary path
(fast_io.ENABLED = False) on small models, with the size thresholds lowered so the
fast path runs."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphopt
from graphopt.errors import ModelError
from graphopt.ir import fast_io, fast_save, onnx_io
from graphopt.ir.onnx_io import load_model, save_model

F = TensorProto.FLOAT
RNG = np.random.default_rng(0)


@pytest.fixture(autouse=True)
def fast_path_for_small_models(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fast_io, "ENABLED", True)
    monkeypatch.setattr(onnx_io, "MIN_MAPPED_FILE_BYTES", 0)
    monkeypatch.setattr(fast_io, "MIN_MAPPED_TENSOR_BYTES", 16)


def slow(fn, *args, **kwargs):
    """Run `fn` on onnx-ir's ordinary path."""
    saved = fast_io.ENABLED
    fast_io.ENABLED = False
    try:
        return fn(*args, **kwargs)
    finally:
        fast_io.ENABLED = saved


def rand(*shape: int, dtype=np.float32, positive: bool = False) -> np.ndarray:
    a = RNG.standard_normal(shape)
    return (np.abs(a) + 0.5 if positive else a).astype(dtype)


def init(name: str, array: np.ndarray) -> TensorProto:
    return numpy_helper.from_array(np.asarray(array), name)


def raw_tensor(name: str, data_type: int, dims: list[int], data: bytes) -> TensorProto:
    return helper.make_tensor(name, data_type, dims, vals=data, raw=True)


def make_model(nodes, inputs, outputs, initializers=(), opset: int = 17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "test", inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def zoo_model() -> onnx.ModelProto:
    """One model with every kind of initializer the fast path must map or leave alone."""
    then_graph = helper.make_graph(
        [helper.make_node("Add", ["x", "sub_w"], ["t"])],
        "then",
        [],
        [helper.make_tensor_value_info("t", F, None)],
        [init("sub_w", rand(4, 4))],
    )
    else_graph = helper.make_graph([helper.make_node("Identity", ["x"], ["e"])], "else", [], [helper.make_tensor_value_info("e", F, None)])
    typed = helper.make_tensor("typed_f32", F, [4, 4], rand(4, 4).ravel().tolist())  # float_data, not raw_data
    documented = init("documented", rand(8))
    documented.doc_string = "a weight with a doc string"
    inits = [
        init("w", rand(4, 4)),
        init("bias", rand(4)),
        init("x", rand(4, 4)),  # also a graph input (its default value)
        init("f16", rand(3, 5, dtype=np.float16)),
        raw_tensor("bf16", TensorProto.BFLOAT16, [2, 8], RNG.integers(0, 2**16, 16, dtype=np.uint16).tobytes()),
        raw_tensor("f8", TensorProto.FLOAT8E4M3FN, [32], RNG.integers(0, 120, 32, dtype=np.uint8).tobytes()),
        init("i64", np.arange(12, dtype=np.int64).reshape(3, 4)),
        init("flags", RNG.integers(0, 2, 40).astype(bool)),
        init("c64", (rand(6) + 1j * rand(6)).astype(np.complex64)),
        init("tiny", np.float32([1.5])),  # below MIN_MAPPED_TENSOR_BYTES: stays in the skeleton
        helper.make_tensor("i4", TensorProto.INT4, [40], RNG.integers(-8, 8, 40).tolist()),  # packed 4-bit
        helper.make_tensor("strings", TensorProto.STRING, [2], [b"a", b"bc"]),
        typed,
        documented,
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"]),
        helper.make_node("Add", ["m", "bias"], ["a"]),
        helper.make_node("If", ["cond"], ["y"], then_branch=then_graph, else_branch=else_graph),
        helper.make_node("Add", ["a", "y"], ["out"]),
    ]
    inputs = [helper.make_tensor_value_info("cond", TensorProto.BOOL, []), helper.make_tensor_value_info("x", F, [4, 4])]
    return make_model(nodes, inputs, [helper.make_tensor_value_info("out", F, [4, 4])], inits)


def conv_bn_model(channels: int = 8, big: bool = False) -> onnx.ModelProto:
    """x -> Conv -> BN -> Relu -> Conv -> BN -> MatMul(w_keep): two foldable pairs; w_keep stays.
    With `big`, a second output z = x2 @ big (a 256 KB weight no rule touches)."""
    c = channels
    nodes, inits = [], [init("w_keep", rand(6, 6))]
    prev = "x"
    for i in range(2):
        nodes += [
            helper.make_node("Conv", [prev, f"w{i}", f"b{i}"], [f"c{i}"], pads=[1, 1, 1, 1]),
            helper.make_node("BatchNormalization", [f"c{i}", f"g{i}", f"beta{i}", f"mean{i}", f"var{i}"], [f"n{i}"], epsilon=1e-3),
            helper.make_node("Relu", [f"n{i}"], [f"r{i}"]),
        ]
        inits += [
            init(f"w{i}", rand(c, 3 if i == 0 else c, 3, 3)),
            init(f"b{i}", rand(c)),
            init(f"g{i}", rand(c)),
            init(f"beta{i}", rand(c)),
            init(f"mean{i}", rand(c)),
            init(f"var{i}", rand(c, positive=True)),
        ]
        prev = f"r{i}"
    nodes.append(helper.make_node("MatMul", [prev, "w_keep"], ["y"]))
    inputs, outputs = [helper.make_tensor_value_info("x", F, [1, 3, 6, 6])], [helper.make_tensor_value_info("y", F, None)]
    if big:
        nodes.append(helper.make_node("MatMul", ["x2", "big"], ["z"]))
        inits.append(init("big", rand(256, 256)))
        inputs.append(helper.make_tensor_value_info("x2", F, [1, 256]))
        outputs.append(helper.make_tensor_value_info("z", F, None))
    return make_model(nodes, inputs, outputs, inits)


def write(model: onnx.ModelProto, path: Path, external: bool = False) -> Path:
    if external:
        model = onnx.ModelProto.FromString(model.SerializeToString())  # onnx converts the proto it saves in place
        onnx.save_model(
            model, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location=path.name + ".data", size_threshold=0
        )
    else:
        onnx.save_model(model, str(path))
    return path


def mapped_names(model: ir.Model) -> set[str]:
    return {name for name, v in model.graph.initializers.items() if isinstance(v.const_value, fast_io.MappedTensor)}


def assert_same_initializers(a: ir.Model, b: ir.Model) -> None:
    for graph_a, graph_b in zip(a.graphs(), b.graphs(), strict=True):
        assert list(graph_a.initializers) == list(graph_b.initializers)
        for name, value in graph_a.initializers.items():
            ta, tb = value.const_value, graph_b.initializers[name].const_value
            assert ta.dtype == tb.dtype and ta.shape == tb.shape, name
            if ta.dtype == ir.DataType.STRING:
                assert ta.string_data() == tb.string_data(), name
                continue
            assert ta.tobytes() == tb.tobytes(), name
            assert np.array_equal(ta.numpy().view(np.uint8), tb.numpy().view(np.uint8)), name


def run(path_or_proto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    source = str(path_or_proto) if isinstance(path_or_proto, Path) else path_or_proto.SerializeToString()
    return ort.InferenceSession(source, providers=["CPUExecutionProvider"]).run(None, feeds)


def canonical(path: Path) -> onnx.ModelProto:
    """The saved model with external data read in, each initializer (subgraphs too) re-encoded
    the one way numpy_helper does it and sorted by name: equal means the same model."""
    proto = onnx.load(str(path))
    graphs = [proto.graph]
    while graphs:
        graph = graphs.pop()
        tensors = []
        for t in sorted(graph.initializer, key=lambda t: t.name):
            tensors.append(numpy_helper.from_array(numpy_helper.to_array(t), t.name))
            tensors[-1].doc_string = t.doc_string
        del graph.initializer[:]
        graph.initializer.extend(tensors)
        graphs.extend(a.g for node in graph.node for a in node.attribute if a.type == onnx.AttributeProto.GRAPH)
    return proto


# ------------------------------------------------------------------ loading


def test_fast_load_equals_onnx_ir_load(tmp_path: Path) -> None:
    path = write(zoo_model(), tmp_path / "zoo.onnx")
    fast, ordinary = load_model(path), slow(load_model, path)
    assert mapped_names(fast) == {"w", "bias", "x", "f16", "bf16", "f8", "i64", "flags", "c64", "documented"}
    assert mapped_names(ordinary) == set()
    assert_same_initializers(fast, ordinary)
    # Everything else too: the serialized models are the same protobuf.
    assert ir.serde.serialize_model(fast) == ir.serde.serialize_model(ordinary)
    # The initializer that is also a graph input is still both.
    x = fast.graph.initializers["x"]
    assert x in fast.graph.inputs and isinstance(x.const_value, fast_io.MappedTensor)
    assert fast.graph.initializers["documented"].const_value.doc_string == "a weight with a doc string"
    # Subgraph initializers, typed-field, packed and string tensors take the ordinary path.
    for name in ("typed_f32", "i4", "strings", "tiny"):
        assert not isinstance(fast.graph.initializers[name].const_value, fast_io.MappedTensor)
    typed = next(t for t in onnx.load(str(path)).graph.initializer if t.name == "typed_f32")
    assert typed.float_data and not typed.raw_data
    np.testing.assert_array_equal(fast.graph.initializers["typed_f32"].const_value.numpy(), numpy_helper.to_array(typed))


def test_mapped_arrays_are_views_of_the_file(tmp_path: Path) -> None:
    weight = rand(64, 64)
    path = write(
        make_model(
            [helper.make_node("MatMul", ["x", "w"], ["y"])],
            [helper.make_tensor_value_info("x", F, [1, 64])],
            [helper.make_tensor_value_info("y", F, None)],
            [init("w", weight)],
        ),
        tmp_path / "m.onnx",
    )
    model = load_model(path)
    array = model.graph.initializers["w"].const_value.numpy()
    assert not array.flags.owndata and not array.flags.writeable  # read-only like onnx-ir's, and not a copy
    assert array.base is not None
    np.testing.assert_array_equal(array, weight)


def test_fast_path_is_off_for_small_files_by_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(onnx_io, "MIN_MAPPED_FILE_BYTES", 32 << 20)
    path = write(zoo_model(), tmp_path / "zoo.onnx")
    assert fast_io.map_model(path, min_file_bytes=onnx_io.MIN_MAPPED_FILE_BYTES) is None
    assert mapped_names(load_model(path)) == set()


def test_model_without_main_graph_initializers(tmp_path: Path) -> None:
    model = make_model(
        [helper.make_node("Relu", ["x"], ["y"])],
        [helper.make_tensor_value_info("x", F, [2])],
        [helper.make_tensor_value_info("y", F, None)],
    )
    path = write(model, tmp_path / "relu.onnx")
    assert fast_io.map_model(path) is None  # nothing to cut: the ordinary parse
    loaded = load_model(path)
    save_model(loaded, tmp_path / "out.onnx")
    assert onnx.load(str(tmp_path / "out.onnx")).graph.node[0].op_type == "Relu"


def test_text_format_is_not_mapped(tmp_path: Path) -> None:
    path = tmp_path / "zoo.textproto"
    onnx.save_model(zoo_model(), str(path), format="textproto")
    assert fast_io.map_model(path) is None
    assert_same_initializers(load_model(path), slow(load_model, path))


@pytest.mark.parametrize("cut", [0.3, 0.6, 0.9, 0.999])
def test_truncated_file_is_a_model_error(tmp_path: Path, cut: float) -> None:
    data = write(conv_bn_model(), tmp_path / "m.onnx").read_bytes()
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(data[: int(len(data) * cut)])
    with pytest.raises(ModelError):
        load_model(bad)


@pytest.mark.parametrize("seed", range(5))
def test_random_bytes_are_a_model_error(tmp_path: Path, seed: int) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(np.random.default_rng(seed).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    with pytest.raises(ModelError):
        load_model(bad)


def test_size_mismatch_is_left_to_the_ordinary_path(tmp_path: Path) -> None:
    model = zoo_model()
    model.graph.initializer[0].raw_data = model.graph.initializer[0].raw_data[:-4]  # 15 floats for a 4x4 tensor
    path = write(model, tmp_path / "bad.onnx")
    mapped = fast_io.map_model(path)
    assert mapped is not None and "w" not in mapped.entries and "bias" in mapped.entries
    # ... where the model's checks refuse it (graphopt/ir/proto_checks.py).
    with pytest.raises(ModelError, match=r"'w' declares \[4, 4\] \(64 bytes\) but its raw_data has 60 bytes"):
        load_model(path)


# ------------------------------------------------------------------ saving, single file


def test_single_file_round_trip_is_byte_identical(tmp_path: Path) -> None:
    path = write(zoo_model(), tmp_path / "zoo.onnx")
    model = load_model(path)
    save_model(model, tmp_path / "fast.onnx")
    slow(save_model, model, tmp_path / "slow.onnx")
    assert (tmp_path / "fast.onnx").read_bytes() == (tmp_path / "slow.onnx").read_bytes()
    onnx.checker.check_model(str(tmp_path / "fast.onnx"))
    assert not list(tmp_path.glob(".*"))  # staging folder gone
    # The model is unchanged by the save and can be saved again.
    save_model(model, tmp_path / "again.onnx")
    assert (tmp_path / "again.onnx").read_bytes() == (tmp_path / "slow.onnx").read_bytes()


@pytest.mark.parametrize("external", [False, True])
def test_optimized_model_saves_and_runs(tmp_path: Path, external: bool) -> None:
    original = conv_bn_model()
    path = write(original, tmp_path / "m.onnx", external=external)
    model = load_model(path)
    model, report = graphopt.optimize(model)
    assert report.rules["FoldConvBatchNorm"].applications == 2
    names = list(model.graph.initializers)
    assert "w_keep" in names and "g0" not in names  # some weights replaced, one kept
    save_model(model, tmp_path / "fast.onnx")
    slow(save_model, model, tmp_path / "slow.onnx")
    assert (tmp_path / "fast.onnx.data").exists() == external == (tmp_path / "slow.onnx.data").exists()
    onnx.checker.check_model(str(tmp_path / "fast.onnx"))
    assert canonical(tmp_path / "fast.onnx") == canonical(tmp_path / "slow.onnx")
    feeds = {"x": rand(1, 3, 6, 6)}
    expected = run(original, feeds)
    for out in ("fast.onnx", "slow.onnx"):
        np.testing.assert_allclose(run(tmp_path / out, feeds)[0], expected[0], rtol=1e-4, atol=1e-4)


def test_changed_and_renamed_tensors_are_reserialized(tmp_path: Path) -> None:
    path = write(zoo_model(), tmp_path / "zoo.onnx")
    model = load_model(path)
    inits = model.graph.initializers
    inits["w"].const_value = ir.Tensor(np.ones((4, 4), np.float32), name="w")  # replaced
    inits["bias"].name = "bias_renamed"  # same tensor, new name: its bytes carry the old name
    inits["f16"].const_value.doc_string = "changed"  # same tensor, new doc string
    assert not inits["f16"].const_value.unchanged_as("f16")
    save_model(model, tmp_path / "fast.onnx")
    slow(save_model, model, tmp_path / "slow.onnx")
    fast_proto = onnx.load(str(tmp_path / "fast.onnx"))
    assert fast_proto == onnx.load(str(tmp_path / "slow.onnx"))
    by_name = {t.name: t for t in fast_proto.graph.initializer}
    assert "bias" not in by_name and "bias_renamed" in by_name
    np.testing.assert_array_equal(numpy_helper.to_array(by_name["w"]), np.ones((4, 4), np.float32))
    assert by_name["f16"].doc_string == "changed"
    assert [t.name for t in fast_proto.graph.initializer] == list(model.graph.initializers)  # order kept


def test_metadata_props_of_a_mapped_tensor_survive(tmp_path: Path) -> None:
    model = zoo_model()
    helper.set_metadata_props(model.graph.initializer[0], {"origin": "unit-test"})
    path = write(model, tmp_path / "m.onnx")
    loaded = load_model(path)
    assert loaded.graph.initializers["w"].const_value.metadata_props == {"origin": "unit-test"}
    save_model(loaded, tmp_path / "out.onnx")
    out = onnx.load(str(tmp_path / "out.onnx"))
    assert {(p.key, p.value) for p in out.graph.initializer[0].metadata_props} == {("origin", "unit-test")}


def test_single_file_in_place(tmp_path: Path) -> None:
    original = conv_bn_model()
    path = write(original, tmp_path / "m.onnx")
    model, _ = graphopt.optimize(load_model(path))
    save_model(model, path)  # the input is mapped while it is replaced
    feeds = {"x": rand(1, 3, 6, 6)}
    np.testing.assert_allclose(run(path, feeds)[0], run(original, feeds)[0], rtol=1e-4, atol=1e-4)
    # Tensors still mapped on the old (replaced) file keep their values.
    np.testing.assert_array_equal(
        model.graph.initializers["w_keep"].const_value.numpy(), numpy_helper.to_array(original.graph.initializer[0])
    )
    assert sorted(os.listdir(tmp_path)) == ["m.onnx"]


def test_optimize_file_end_to_end(tmp_path: Path) -> None:
    original = conv_bn_model()
    path = write(original, tmp_path / "m.onnx")
    graphopt.optimize_file(path, tmp_path / "out.onnx")
    feeds = {"x": rand(1, 3, 6, 6)}
    np.testing.assert_allclose(run(tmp_path / "out.onnx", feeds)[0], run(original, feeds)[0], rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------ saving, external data


def test_mapped_input_to_external_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fast_save, "EXTERNAL_SIZE_THRESHOLD", 16)  # the zoo's tensors are small
    path = write(zoo_model(), tmp_path / "zoo.onnx")
    model = load_model(path)
    save_model(model, tmp_path / "fast.onnx", external_data=True)
    slow(save_model, model, tmp_path / "slow.onnx", external_data=True)
    onnx.checker.check_model(str(tmp_path / "fast.onnx"))
    fast_proto = onnx.load(str(tmp_path / "fast.onnx"), load_external_data=False)
    assert any(t.data_location == TensorProto.EXTERNAL for t in fast_proto.graph.initializer)
    assert_same_initializers(load_model(tmp_path / "fast.onnx"), load_model(tmp_path / "slow.onnx"))
    assert canonical(tmp_path / "fast.onnx") == canonical(tmp_path / "slow.onnx")


def external_bn_model(tmp_path: Path) -> tuple[onnx.ModelProto, Path]:
    """conv_bn_model with a big untouched weight, saved as in/m.onnx + in/m.onnx.data (every tensor external)."""
    original = conv_bn_model(big=True)
    (tmp_path / "in").mkdir()
    return original, write(original, tmp_path / "in" / "m.onnx", external=True)


def external_info(tensor: TensorProto) -> dict[str, str]:
    return {e.key: e.value for e in tensor.external_data}


def feeds() -> dict[str, np.ndarray]:
    return {"x": rand(1, 3, 6, 6), "x2": rand(1, 256)}


def test_external_data_file_is_reused_when_mostly_untouched(tmp_path: Path) -> None:
    original, path = external_bn_model(tmp_path)
    model, _ = graphopt.optimize(load_model(path))
    before = {t.name: t for t in onnx.load(str(path), load_external_data=False).graph.initializer}
    save_model(model, tmp_path / "out.onnx")
    data = (tmp_path / "out.onnx.data").read_bytes()
    source = (tmp_path / "in" / "m.onnx.data").read_bytes()
    assert data[: len(source)] == source and len(data) > len(source)  # the input's file, then new tensors
    after = {t.name: t for t in onnx.load(str(tmp_path / "out.onnx"), load_external_data=False).graph.initializer}
    for name in ("w_keep", "big"):  # untouched: same place
        assert external_info(after[name]) == {**external_info(before[name]), "location": "out.onnx.data"}
    new_offsets = [int(external_info(t)["offset"]) for name, t in after.items() if name not in before and t.external_data]
    assert new_offsets and all(o >= len(source) and o % 64 == 0 for o in new_offsets)
    onnx.checker.check_model(str(tmp_path / "out.onnx"))
    inputs = feeds()
    for got, expected in zip(run(tmp_path / "out.onnx", inputs), run(original, inputs), strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    assert_same_initializers(load_model(tmp_path / "out.onnx"), model)


def test_external_data_is_compacted_when_mostly_rewritten(tmp_path: Path) -> None:
    original, path = external_bn_model(tmp_path)
    model, _ = graphopt.optimize(load_model(path))
    big = model.graph.initializers["big"]
    big.const_value = ir.Tensor(big.const_value.numpy() * 2, name="big")  # now most of the input's data file is unused
    save_model(model, tmp_path / "out.onnx")
    assert os.path.getsize(tmp_path / "out.onnx.data") < os.path.getsize(tmp_path / "in" / "m.onnx.data") * 1.01
    assert (tmp_path / "out.onnx.data").read_bytes()[:1024] != (tmp_path / "in" / "m.onnx.data").read_bytes()[:1024]
    inputs = feeds()
    got, expected = run(tmp_path / "out.onnx", inputs), run(original, inputs)
    np.testing.assert_allclose(got[0], expected[0], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got[1], expected[1] * 2, rtol=1e-4, atol=1e-4)
    assert_same_initializers(load_model(tmp_path / "out.onnx"), model)


def test_external_data_in_place(tmp_path: Path) -> None:
    original, path = external_bn_model(tmp_path)
    model = load_model(path)
    model.graph.initializers["w_keep"].const_value.numpy()  # mapped before the file is replaced
    model, _ = graphopt.optimize(model)
    # Read now: saving deletes the input's data file, which `model`'s tensors point into.
    before = [{n: (str(v.const_value.dtype), tuple(v.const_value.shape), v.const_value.tobytes()) for n, v in g.initializers.items()} for g in model.graphs()]
    save_model(model, path)
    # The new data goes in under the name the replaced model did not read, so m.onnx was loadable
    # throughout; the replaced model's data file is deleted once nothing reads it.
    assert sorted(os.listdir(path.parent)) == ["m.onnx", "m.onnx.alt.data"]
    inputs = feeds()
    for got, expected in zip(run(path, inputs), run(original, inputs), strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    reloaded = [{n: (str(v.const_value.dtype), tuple(v.const_value.shape), v.const_value.tobytes()) for n, v in g.initializers.items()} for g in load_model(path).graphs()]
    assert reloaded == before


def test_external_data_reuse_keeps_small_external_tensors_valid(tmp_path: Path) -> None:
    """A tiny tensor that was external in the input stays readable (in the copied file)."""
    original, path = external_bn_model(tmp_path)
    model = load_model(path)
    save_model(model, tmp_path / "out.onnx")
    assert (tmp_path / "out.onnx.data").read_bytes() == (tmp_path / "in" / "m.onnx.data").read_bytes()
    assert_same_initializers(load_model(tmp_path / "out.onnx"), slow(load_model, path))
