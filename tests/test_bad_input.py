"""Bad input never crashes: `graphopt optimize` exits 2 with one `error:` line and writes nothing."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import WRONG_PDLL, CliResult, conv_bn_model, make_model, relu_chain_model, run_cli
from onnx import TensorProto, helper, numpy_helper
from onnx.external_data_helper import set_external_data

F = TensorProto.FLOAT


@pytest.fixture
def out_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "out"
    folder.mkdir()
    return folder


def optimize(tmp_path: Path, model: Path | str, out: Path, *extra: str | os.PathLike[str]) -> CliResult:
    return run_cli("optimize", model, "-o", out, *extra, cwd=tmp_path)


def assert_error(result: CliResult, out: Path, *needles: str) -> str:
    """Exit 2, exactly one stderr line starting with `error:` that mentions every needle,
    and nothing written where the output would go (no model, no data file, no temp files)."""
    assert result.returncode == 2, f"exit {result.returncode}\nstdout: {result.stdout}\nstderr: {result.stderr}"
    lines = result.stderr.splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got:\n{result.stderr}"
    line = lines[0]
    assert line.startswith("error: "), line
    for needle in needles:
        assert needle.lower() in line.lower(), f"{needle!r} not in {line!r}"
    assert "Traceback" not in result.stderr + result.stdout
    assert not out.exists() and not out.with_name(out.name + ".data").exists()
    if out.parent.is_dir():
        assert [p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}")] == []
    return line


def _save(model: onnx.ModelProto, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    # onnx.save would refuse or fix some of the broken models; write the bytes as they are.
    path.write_bytes(model.SerializeToString())
    return path


def _relu(opset: int = 17) -> onnx.ModelProto:
    return make_model(
        [helper.make_node("Relu", ["x"], ["y"])],
        [helper.make_tensor_value_info("x", F, [1, 4])],
        [helper.make_tensor_value_info("y", F, [1, 4])],
        opset=opset,
    )


def _external(location: str, offset: int | None = None, length: int | None = None) -> onnx.ModelProto:
    w = numpy_helper.from_array(np.ones((1, 4), np.float32), "w")
    set_external_data(w, location, offset=offset, length=length)
    w.ClearField("raw_data")
    w.data_location = TensorProto.EXTERNAL
    return make_model(
        [helper.make_node("Add", ["x", "w"], ["y"])],
        [helper.make_tensor_value_info("x", F, [1, 4])],
        [helper.make_tensor_value_info("y", F, [1, 4])],
        [w],
    )


# ------------------------------------------------------------------ the model file


def test_missing_file(tmp_path: Path, out_dir: Path) -> None:
    assert_error(optimize(tmp_path, tmp_path / "nope.onnx", out_dir / "o.onnx"), out_dir / "o.onnx", "nope.onnx", "no such file")


def test_a_directory(tmp_path: Path, out_dir: Path) -> None:
    (tmp_path / "adir").mkdir()
    assert_error(optimize(tmp_path, tmp_path / "adir", out_dir / "o.onnx"), out_dir / "o.onnx", "adir", "directory")


def test_empty_file(tmp_path: Path, out_dir: Path) -> None:
    (tmp_path / "empty.onnx").write_bytes(b"")
    assert_error(optimize(tmp_path, tmp_path / "empty.onnx", out_dir / "o.onnx"), out_dir / "o.onnx", "empty")


@pytest.mark.parametrize("name", ["notes.onnx", "notes.txt"])
def test_a_text_file(tmp_path: Path, out_dir: Path, name: str) -> None:
    (tmp_path / name).write_text("This is not a model.\nir_version: 8\n")
    assert_error(optimize(tmp_path, tmp_path / name, out_dir / "o.onnx"), out_dir / "o.onnx", name, "not a valid ONNX model")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_bytes(tmp_path: Path, out_dir: Path, seed: int) -> None:
    (tmp_path / "r.onnx").write_bytes(np.random.default_rng(seed).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    assert_error(optimize(tmp_path, tmp_path / "r.onnx", out_dir / "o.onnx"), out_dir / "o.onnx", "r.onnx")


@pytest.mark.parametrize("fraction", [0.5, 0.9])
def test_truncated_protobuf(tmp_path: Path, out_dir: Path, fraction: float) -> None:
    data = conv_bn_model().SerializeToString()
    (tmp_path / "cut.onnx").write_bytes(data[: int(len(data) * fraction)])
    assert_error(optimize(tmp_path, tmp_path / "cut.onnx", out_dir / "o.onnx"), out_dir / "o.onnx", "cut.onnx")


@pytest.mark.parametrize("opset", [99, 1])
def test_unsupported_opset(tmp_path: Path, out_dir: Path, opset: int) -> None:
    path = _save(_relu(opset), tmp_path / "old.onnx")
    assert_error(optimize(tmp_path, path, out_dir / "o.onnx"), out_dir / "o.onnx", "opset", str(opset))


def test_no_default_opset(tmp_path: Path, out_dir: Path) -> None:
    model = _relu()
    del model.opset_import[:]
    model.opset_import.append(helper.make_opsetid("com.example", 1))
    path = _save(model, tmp_path / "m.onnx")
    assert_error(optimize(tmp_path, path, out_dir / "o.onnx"), out_dir / "o.onnx", "opset")


def test_graph_with_a_cycle(tmp_path: Path, out_dir: Path) -> None:
    model = make_model(
        [helper.make_node("Add", ["x", "b"], ["a"]), helper.make_node("Relu", ["a"], ["b"]), helper.make_node("Relu", ["b"], ["y"])],
        [helper.make_tensor_value_info("x", F, [1, 4])],
        [helper.make_tensor_value_info("y", F, [1, 4])],
    )
    path = _save(model, tmp_path / "cycle.onnx")
    assert_error(optimize(tmp_path, path, out_dir / "o.onnx"), out_dir / "o.onnx", "cycle")


def test_dangling_value_name(tmp_path: Path, out_dir: Path) -> None:
    model = make_model(
        [helper.make_node("Add", ["x", "nowhere"], ["y"])],
        [helper.make_tensor_value_info("x", F, [1, 4])],
        [helper.make_tensor_value_info("y", F, [1, 4])],
    )
    path = _save(model, tmp_path / "dangling.onnx")
    assert_error(optimize(tmp_path, path, out_dir / "o.onnx"), out_dir / "o.onnx", "nowhere")


def test_undefined_graph_output(tmp_path: Path, out_dir: Path) -> None:
    model = make_model(
        [helper.make_node("Relu", ["x"], ["r"])],
        [helper.make_tensor_value_info("x", F, [1, 4])],
        [helper.make_tensor_value_info("y", F, [1, 4])],
    )
    path = _save(model, tmp_path / "out.onnx")
    assert_error(optimize(tmp_path, path, out_dir / "o.onnx"), out_dir / "o.onnx", "'y'")


# ------------------------------------------------------------------ external data


def test_missing_external_data_file(tmp_path: Path, out_dir: Path) -> None:
    path = _save(_external("weights.bin"), tmp_path / "m.onnx")
    assert_error(optimize(tmp_path, path, out_dir / "o.onnx"), out_dir / "o.onnx", "weights.bin", "missing")


def test_external_data_shorter_than_declared(tmp_path: Path, out_dir: Path) -> None:
    (tmp_path / "weights.bin").write_bytes(b"\0" * 16)
    path = _save(_external("weights.bin", offset=8, length=16), tmp_path / "m.onnx")
    assert_error(optimize(tmp_path, path, out_dir / "o.onnx"), out_dir / "o.onnx", "weights.bin", "past the end")


def test_external_data_file_too_short_for_the_tensor(tmp_path: Path, out_dir: Path) -> None:
    (tmp_path / "weights.bin").write_bytes(b"\0" * 8)  # the tensor needs 16 bytes
    path = _save(_external("weights.bin"), tmp_path / "m.onnx")
    assert_error(optimize(tmp_path, path, out_dir / "o.onnx"), out_dir / "o.onnx", "weights.bin")


@pytest.mark.parametrize("kind", ["dotdot", "absolute", "symlink"])
def test_external_data_outside_the_models_folder(tmp_path: Path, out_dir: Path, kind: str) -> None:
    secret = tmp_path / "secret.bin"
    secret.write_bytes(b"\0" * 16)
    folder = tmp_path / "model"
    folder.mkdir()
    if kind == "dotdot":
        location = "../secret.bin"
    elif kind == "absolute":
        location = str(secret)
    else:
        (folder / "link.bin").symlink_to(secret)
        location = "link.bin"
    path = _save(_external(location), folder / "m.onnx")
    assert_error(optimize(tmp_path, path, out_dir / "o.onnx"), out_dir / "o.onnx", "outside the model's folder")


def test_constant_node_data_outside_the_models_folder(tmp_path: Path, out_dir: Path) -> None:
    """A Constant node's tensor can live in an external file too; it gets the same checks."""
    (tmp_path / "secret.bin").write_bytes(b"\0" * 16)
    value = numpy_helper.from_array(np.ones((1, 4), np.float32), "c")
    set_external_data(value, "../secret.bin")
    value.ClearField("raw_data")
    value.data_location = TensorProto.EXTERNAL
    model = make_model(
        [helper.make_node("Constant", [], ["c"], value=value), helper.make_node("Add", ["x", "c"], ["y"])],
        [helper.make_tensor_value_info("x", F, [1, 4])],
        [helper.make_tensor_value_info("y", F, [1, 4])],
    )
    path = _save(model, tmp_path / "model" / "m.onnx")
    assert_error(optimize(tmp_path, path, out_dir / "o.onnx"), out_dir / "o.onnx", "outside the model's folder")


# ------------------------------------------------------------------ patterns and options


def test_pdll_syntax_error_names_file_line_col(tmp_path: Path, out_dir: Path) -> None:
    model = _save(relu_chain_model(), tmp_path / "m.onnx")
    patterns = tmp_path / "pats"
    patterns.mkdir()
    (patterns / "broken.pdll").write_text("// fine so far\nPattern Broken {\n  let r = op<Relu>(x;\n  replace r with x;\n}\n")
    line = assert_error(optimize(tmp_path, model, out_dir / "o.onnx", "--patterns", patterns), out_dir / "o.onnx", "broken.pdll:3:")
    assert line.split("broken.pdll:3:")[1][0].isdigit()  # a column follows the line


def test_missing_patterns_folder(tmp_path: Path, out_dir: Path) -> None:
    model = _save(relu_chain_model(), tmp_path / "m.onnx")
    assert_error(optimize(tmp_path, model, out_dir / "o.onnx", "--patterns", tmp_path / "nope"), out_dir / "o.onnx", "nope")


@pytest.mark.parametrize("flag", ["--enable", "--disable"])
def test_unknown_rule_name(tmp_path: Path, out_dir: Path, flag: str) -> None:
    model = _save(relu_chain_model(), tmp_path / "m.onnx")
    assert_error(optimize(tmp_path, model, out_dir / "o.onnx", flag, "NoSuchRule"), out_dir / "o.onnx", "NoSuchRule")


def test_user_rule_name_is_known(tmp_path: Path, out_dir: Path) -> None:
    """The counterpart of the unknown-name test: a rule from --patterns can be named."""
    model = _save(relu_chain_model(), tmp_path / "m.onnx")
    (tmp_path / "wrong.pdll").write_text(WRONG_PDLL)
    result = optimize(tmp_path, model, out_dir / "o.onnx", "--patterns", tmp_path / "wrong.pdll", "--disable", "DropRelu", "-q")
    assert result.returncode == 0, result.stderr


def test_unknown_target(tmp_path: Path, out_dir: Path) -> None:
    model = _save(relu_chain_model(), tmp_path / "m.onnx")
    assert_error(optimize(tmp_path, model, out_dir / "o.onnx", "--target", "tpu"), out_dir / "o.onnx", "unknown target", "tpu")


@pytest.mark.parametrize("text", ["x", "x=1,a", "=3"])
def test_malformed_input_shape(tmp_path: Path, out_dir: Path, text: str) -> None:
    model = _save(relu_chain_model(), tmp_path / "m.onnx")
    assert_error(optimize(tmp_path, model, out_dir / "o.onnx", "--verify", "--input-shape", text), out_dir / "o.onnx", "--input-shape")


def test_input_shape_for_an_unknown_input(tmp_path: Path, out_dir: Path) -> None:
    model = _save(relu_chain_model(), tmp_path / "m.onnx")
    assert_error(
        optimize(tmp_path, model, out_dir / "o.onnx", "--verify", "--input-shape", "nope=1,2"),
        out_dir / "o.onnx",
        "nope",
        "not a model input",
    )


# ------------------------------------------------------------------ the output location


def test_output_folder_does_not_exist(tmp_path: Path) -> None:
    model = _save(relu_chain_model(), tmp_path / "m.onnx")
    out = tmp_path / "missing" / "o.onnx"
    assert_error(optimize(tmp_path, model, out), out, "does not exist")


def test_output_is_a_directory(tmp_path: Path, out_dir: Path) -> None:
    model = _save(relu_chain_model(), tmp_path / "m.onnx")
    result = optimize(tmp_path, model, out_dir)
    assert result.returncode == 2 and result.stderr.startswith("error:") and "directory" in result.stderr
    assert list(out_dir.iterdir()) == []


def test_output_folder_is_a_file(tmp_path: Path) -> None:
    model = _save(relu_chain_model(), tmp_path / "m.onnx")
    (tmp_path / "afile").write_text("x")
    out = tmp_path / "afile" / "o.onnx"
    assert_error(optimize(tmp_path, model, out), out, "not a folder")


def test_read_only_output_folder(tmp_path: Path) -> None:
    model = _save(relu_chain_model(), tmp_path / "m.onnx")
    if os.geteuid() == 0:
        # chmod does not stop root; a read-only file system does.
        out = Path("/proc/graphopt-test.onnx")
        assert_error(optimize(tmp_path, model, out), out, "cannot write")
        return
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        out = folder / "o.onnx"
        assert_error(optimize(tmp_path, model, out), out, "cannot write")
    finally:
        folder.chmod(stat.S_IRWXU)


def test_report_folder_does_not_exist(tmp_path: Path, out_dir: Path) -> None:
    model = _save(relu_chain_model(), tmp_path / "m.onnx")
    assert_error(optimize(tmp_path, model, out_dir / "o.onnx", "--report", tmp_path / "nope" / "r.json"), out_dir / "o.onnx", "report")


def test_report_path_is_the_input(tmp_path: Path, out_dir: Path) -> None:
    model = _save(relu_chain_model(), tmp_path / "m.onnx")
    before = model.read_bytes()
    assert_error(optimize(tmp_path, model, out_dir / "o.onnx", "--report", model), out_dir / "o.onnx", "report")
    assert model.read_bytes() == before


def test_value_defined_twice(tmp_path: Path, out_dir: Path) -> None:
    model = make_model(
        [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Relu", ["x"], ["y"])],
        [helper.make_tensor_value_info("x", F, [1, 4])],
        [helper.make_tensor_value_info("y", F, [1, 4])],
    )
    path = _save(model, tmp_path / "twice.onnx")
    assert_error(optimize(tmp_path, path, out_dir / "o.onnx"), out_dir / "o.onnx", "'y'", "redeclared")


def test_verify_on_a_model_that_fails_with_the_default_shapes(tmp_path: Path, out_dir: Path) -> None:
    """onnxruntime's own error log stays off stderr; the one line says how to fix it."""
    model = make_model(
        [helper.make_node("Reshape", ["x", "s"], ["y"])],
        [helper.make_tensor_value_info("x", F, ["n", 6])],
        [helper.make_tensor_value_info("y", F, [3, 4])],
        [numpy_helper.from_array(np.array([3, 4], np.int64), "s")],
    )
    path = _save(model, tmp_path / "m.onnx")
    assert_error(optimize(tmp_path, path, out_dir / "o.onnx", "--verify"), out_dir / "o.onnx", "cannot verify", "--input-shape")
    result = optimize(tmp_path, path, out_dir / "o.onnx", "--verify", "--input-shape", "x=2,6", "-q")
    assert result.returncode == 0, result.stderr
