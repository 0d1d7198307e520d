"""Text from a model never reaches the terminal raw (issue 16): a node name holding escape
sequences ("\\x1b[2J" clears the screen, "\\x1b]0;...\\x07" retitles the window) is printed
escaped in the summary's near-miss table, in `graphopt explain` and in `error:` lines."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hostile.corpus import _relu_model, _write
from hostile.runner import WarmCli
from onnx import TensorProto, helper, numpy_helper

from graphopt.errors import printable

EVIL = "conv\x1b[2J\x1b]0;pwned\x07\r\x85"


@pytest.fixture(scope="module")
def cli(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WarmCli]:
    folder = tmp_path_factory.mktemp("warm")
    with WarmCli(["optimize", str(_write(folder, _relu_model())), "-o", str(folder / "warm.opt.onnx"), "-q"]) as server:
        yield server


def _near_miss_model(folder: Path) -> Path:
    """Conv -> BatchNormalization whose scale is an input: FoldConvBatchNorm misses at the evil BatchNormalization."""
    w = numpy_helper.from_array(np.ones((2, 1, 1, 1), np.float32), "w")
    consts = [numpy_helper.from_array(np.full(2, v, np.float32), n) for n, v in (("b", 0.0), ("m", 0.0), ("v", 1.0))]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"), helper.make_node("BatchNormalization", ["c", "g", "b", "m", "v"], ["y"], name=EVIL)]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 2, 2]), helper.make_tensor_value_info("g", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 2, 2])],
        [w, *consts],
    )
    return _write(folder, helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8))


def test_printable_escapes_control_characters_only() -> None:
    assert printable(EVIL) == "conv\\x1b[2J\\x1b]0;pwned\\x07\\r\\x85"
    assert printable("café ünïcode → ok") == "café ünïcode → ok"


@pytest.mark.parametrize("command", ["optimize", "explain", "diff"])
def test_model_text_is_escaped_in_the_terminal_output(cli: WarmCli, tmp_path: Path, command: str) -> None:
    model = _near_miss_model(tmp_path)
    other = _write(tmp_path, _relu_model(), "other.onnx")
    args = {
        "optimize": ["optimize", model, "-o", tmp_path / "out.onnx"],
        "explain": ["explain", model, "--rule", "FoldConvBatchNorm"],
        "diff": ["diff", model, other],
    }[command]
    result = cli.run(args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    output = result.stdout + result.stderr
    assert "\x1b" not in output and "\x07" not in output
    assert "conv\\x1b[2J" in output, output  # the name is there, escaped
