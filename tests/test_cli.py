"""End to end through `python -m graphopt` on small models."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import conv_bn_model, int_bool_model, run_cli
from test_report import validate

import graphopt


def _run(path: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)


def _feeds() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"x": rng.standard_normal((2, 3, 8, 8)).astype(np.float32), "w_in": rng.standard_normal((4, 4, 3, 3)).astype(np.float32)}


def test_optimize_end_to_end(cli, conv_bn_path: Path, tmp_path: Path) -> None:
    out, report = tmp_path / "out.onnx", tmp_path / "report.json"
    result = cli("optimize", conv_bn_path, "-o", out, "--report", report)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    # The output runs in onnxruntime and computes what the input did.
    for want, got in zip(_run(conv_bn_path, _feeds()), _run(out, _feeds()), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert "BatchNormalization" not in [n.op_type for n in onnx.load(str(out)).graph.node]
    document = json.loads(report.read_text())
    validate(document)
    fold = next(r for r in document["rules"] if r["name"] == "FoldConvBatchNorm")
    assert fold["applications"] == 2 and fold["near_misses"]
    assert document["input_path"] == str(conv_bn_path) and document["output_path"] == str(out)
    # The summary: op changes, rules, where to find the output.
    assert re.search(r"BatchNormalization\s*│\s*3\s*│\s*0", result.stdout)
    assert "FoldConvBatchNorm" in result.stdout and f"wrote {out}" in result.stdout


def test_input_is_never_modified(cli, conv_bn_path: Path, tmp_path: Path) -> None:
    before = conv_bn_path.read_bytes()
    assert cli("optimize", conv_bn_path, "-o", tmp_path / "o.onnx", "--verify").returncode == 0
    assert conv_bn_path.read_bytes() == before


def test_quiet_prints_nothing(cli, conv_bn_path: Path, tmp_path: Path) -> None:
    result = cli("optimize", conv_bn_path, "-o", tmp_path / "o.onnx", "--quiet", "--verify")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "" and result.stderr == ""
    assert (tmp_path / "o.onnx").exists()


def test_verify_passes_and_is_reported(cli, conv_bn_path: Path, tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    result = cli("optimize", conv_bn_path, "-o", tmp_path / "o.onnx", "--verify", "--report", report, "--input-shape", "x=2,3,8,8")
    assert result.returncode == 0, result.stderr
    assert "verification: passed" in result.stdout
    verification = json.loads(report.read_text())["verification"]
    assert verification["passed"] and verification["input_shapes"]["x"] == [2, 3, 8, 8]


def test_verify_drops_a_wrong_rule(cli, conv_bn_path: Path, tmp_path: Path, wrong_patterns: Path) -> None:
    out, report = tmp_path / "o.onnx", tmp_path / "r.json"
    result = cli("optimize", conv_bn_path, "-o", out, "--verify", "--patterns", wrong_patterns, "--report", report)
    assert result.returncode == 0, result.stderr
    assert "DropRelu at relu1_out" in result.stdout
    document = json.loads(report.read_text())
    assert document["verification"]["dropped"] == ["DropRelu at relu1_out"]
    assert "Relu" in [n.op_type for n in onnx.load(str(out)).graph.node]


def test_verification_failure_exits_1_and_writes_only_the_report(write_model, tmp_path: Path, wrong_patterns: Path) -> None:
    """When verification cannot be repaired: exit 1, one error line, the report but no model."""
    from conftest import relu_chain_model

    model = write_model(relu_chain_model(), "relu.onnx")
    out, report = tmp_path / "o.onnx", tmp_path / "r.json"
    # With no repair allowed, the wrong rewrite stays and verification fails.
    result = run_cli(
        "optimize", model, "-o", out, "--verify", "--patterns", wrong_patterns, "--report", report, "--max-repairs", "0", cwd=tmp_path
    )
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: verification failed")
    assert not out.exists()
    document = json.loads(report.read_text())
    validate(document)
    assert document["verification"]["passed"] is False and document["output_path"] is None


def test_int_and_bool_inputs_verify(cli, write_model, tmp_path: Path) -> None:
    model = write_model(int_bool_model(), "ids.onnx")
    result = cli("optimize", model, "-o", tmp_path / "o.onnx", "--verify", "--input-shape", "ids=2,5")
    assert result.returncode == 0, result.stderr


def test_target_ort_cpu(cli, conv_bn_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "o.onnx"
    result = cli("optimize", conv_bn_path, "-o", out, "--target", "ort-cpu", "--verify", "--quiet")
    assert result.returncode == 0, result.stderr
    _run(out, _feeds())


def test_enable_and_disable(cli, conv_bn_path: Path, tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    assert (
        cli("optimize", conv_bn_path, "-o", tmp_path / "a.onnx", "--disable", "FoldConvBatchNorm", "--report", report, "-q").returncode == 0
    )
    names = {r["name"]: r["applications"] for r in json.loads(report.read_text())["rules"]}
    assert "FoldConvBatchNorm" not in names
    assert (
        cli("optimize", conv_bn_path, "-o", tmp_path / "b.onnx", "--enable", "FoldConvBatchNorm", "--report", report, "-q").returncode == 0
    )
    names = {r["name"]: r["applications"] for r in json.loads(report.read_text())["rules"]}
    assert names == {"FoldConvBatchNorm": 2}


def test_output_equal_to_input_needs_force(cli, conv_bn_path: Path) -> None:
    before = conv_bn_path.read_bytes()
    result = cli("optimize", conv_bn_path, "-o", conv_bn_path)
    assert result.returncode == 2
    assert result.stderr.startswith("error:") and "--force" in result.stderr
    assert conv_bn_path.read_bytes() == before
    result = cli("optimize", conv_bn_path, "-o", conv_bn_path, "--force", "-q")
    assert result.returncode == 0, result.stderr
    assert "BatchNormalization" not in [n.op_type for n in onnx.load(str(conv_bn_path)).graph.node]


def test_external_data_input_and_output(cli, tmp_path: Path) -> None:
    folder = tmp_path / "ext"
    folder.mkdir()
    model = conv_bn_model(with_miss=False)
    onnx.save(model, str(folder / "m.onnx"), save_as_external_data=True, location="m.onnx.data", size_threshold=0)
    data_before = (folder / "m.onnx.data").read_bytes()
    out = tmp_path / "o.onnx"
    result = run_cli("optimize", folder / "m.onnx", "-o", out, "--verify", "-q", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    _run(out, {"x": _feeds()["x"]})  # whatever it references exists and loads
    assert (folder / "m.onnx.data").read_bytes() == data_before
    # Writing over the input's external data file is refused.
    result = run_cli("optimize", folder / "m.onnx", "-o", folder / "m.onnx.data", "-q", cwd=tmp_path)
    assert result.returncode == 2 and "external data" in result.stderr
    assert (folder / "m.onnx.data").read_bytes() == data_before


def test_constant_with_external_data_is_written_self_contained(tmp_path: Path) -> None:
    """A Constant node whose tensor lives in a file beside the input must not point there
    from the output, which is written to another folder."""
    from conftest import make_model
    from onnx import TensorProto, helper, numpy_helper
    from onnx.external_data_helper import set_external_data

    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "c.bin").write_bytes(np.arange(4, dtype=np.float32).tobytes())
    value = numpy_helper.from_array(np.zeros((1, 4), np.float32), "c")
    set_external_data(value, "c.bin")
    value.ClearField("raw_data")
    value.data_location = TensorProto.EXTERNAL
    model = make_model(
        [helper.make_node("Constant", [], ["c"], value=value), helper.make_node("Add", ["x", "c"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    (folder / "m.onnx").write_bytes(model.SerializeToString())
    (tmp_path / "out").mkdir()
    out = tmp_path / "out" / "o.onnx"
    result = run_cli("optimize", folder / "m.onnx", "-o", out, "--verify", "-q", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    (y,) = _run(out, {"x": np.ones((1, 4), np.float32)})
    np.testing.assert_array_equal(y, [[1, 2, 3, 4]])


def test_patterns_lists_rules_with_source(cli) -> None:
    result = cli("patterns")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    fold = next(line for line in lines if "\tFoldConvBatchNorm\t" in line)
    assert re.search(r"conv_bn\.pdll:\d+", fold)
    assert "BatchNormalization" in fold  # the one-line doc
    assert any(line.startswith("rewrite\tFoldConvBN\t") and re.search(r"conv_bn\.py:\d+", line) for line in lines)


def test_patterns_includes_user_patterns(cli, wrong_patterns: Path) -> None:
    result = cli("patterns", "--patterns", wrong_patterns)
    assert result.returncode == 0, result.stderr
    line = next(line for line in result.stdout.splitlines() if "\tDropRelu\t" in line)
    assert "wrong.pdll:4" in line and "Relu(x) -> x" in line


def test_version(cli) -> None:
    result = cli("version")
    assert result.returncode == 0
    assert result.stdout.startswith(f"graphopt {graphopt.__version__}")


def test_no_arguments_shows_help(cli) -> None:
    result = cli()
    assert "optimize" in result.stdout + result.stderr


@pytest.mark.parametrize("args", [["optimize"], ["optimize", "m.onnx"], ["optimize", "m.onnx", "-o", "x", "--bogus"]])
def test_usage_errors_keep_typer_exit_code(cli, args: list[str]) -> None:
    assert cli(*args).returncode == 2


def test_layout_option_is_checked(tmp_path) -> None:
    import subprocess
    import sys

    import onnx

    from tests.rule_testing import TensorProto, helper, make_model

    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    for args, message in ((["--layout", "sideways", "--target", "ort-cuda"], "unknown layout"),
                          (["--layout", "nhwc"], "only applies with --target ort-cuda")):
        done = subprocess.run([sys.executable, "-m", "graphopt", "optimize", str(path), "-o", str(tmp_path / "o.onnx"), *args],
                              capture_output=True, text=True)
        assert done.returncode == 2 and message in done.stderr
        assert not (tmp_path / "o.onnx").exists()
    done = subprocess.run([sys.executable, "-m", "graphopt", "optimize", str(path), "-o", str(tmp_path / "o.onnx"),
                           "--target", "ort-cuda", "--layout", "nchw", "-q"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
