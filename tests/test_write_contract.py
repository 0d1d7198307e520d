"""The write contract, attacked through paths and user code (issue 16).

* No path a run writes (the output, its data file, the report) may be a path it reads
  (the input, its external data, pattern files) or another path it writes, whatever the
  spelling: the same name, `dir/../name`, a symbolic link, a hard link. Such a run is
  refused with one `error:` line before anything is written, the input untouched.
* `-o IN --force` on a model with external data: a run killed at any step of the
  replacement leaves IN loadable with its original outputs, or the new model complete.
* Names that are valid but long: the temporary names graphopt derives always fit; a
  name the file system cannot hold is refused before anything is written.
* User code (`--patterns x.py`, its helpers) that raises or calls sys.exit, on import or
  while matching: exit 2 and `error: FILE:LINE: ...`, never exit 0 with nothing done.
* A user rule named like a built-in one is refused unless `--replace NAME` says so.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hostile.corpus import _relu_model, _write
from hostile.runner import Finished, WarmCli
from onnx import TensorProto, helper, numpy_helper

from graphopt.ir import onnx_io

F = TensorProto.FLOAT
X = np.linspace(-1, 1, 64, dtype=np.float32).reshape(1, 64)


@pytest.fixture(scope="module")
def cli(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WarmCli]:
    folder = tmp_path_factory.mktemp("warm")
    model = _write(folder, _relu_model())
    with WarmCli(["optimize", str(model), "-o", str(folder / "warm.opt.onnx"), "-q"]) as server:
        yield server


def _external_model(folder: Path, name: str = "in.onnx", value: float = 0.5) -> Path:
    """y = Relu(Relu(x @ w)) with w (64 x 64) in `name.data`: graphopt drops one Relu."""
    w = numpy_helper.from_array(np.full((64, 64), value, np.float32) * np.eye(64, dtype=np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["r"]), helper.make_node("Relu", ["r"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", F, [1, 64])],
        [helper.make_tensor_value_info("y", F, [1, 64])],
        [w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    path = folder / name
    onnx.save_model(model, str(path), save_as_external_data=True, location=name + ".data", size_threshold=0)
    return path


def _run(path: Path) -> np.ndarray:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]).run(None, {"x": X})[0]


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def _assert_refused(result: Finished, *needles: str) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 2, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


# ------------------------------------------------------------------ path aliasing


def _alias(kind: str, target: Path, where: Path) -> Path:
    """A path to `target` spelled another way (created in `where`)."""
    if kind == "same":
        return target
    if kind == "dotdot":
        return target.parent / "sub" / ".." / target.name
    if kind == "symlink":
        link = where / f"link-to-{target.name}"
        link.symlink_to(target)
        return link
    if kind == "hardlink":
        link = where / f"hard-{target.name}"
        os.link(target, link)
        return link
    raise ValueError(kind)


ALIAS_KINDS = ["same", "dotdot", "symlink", "hardlink"]


@pytest.mark.parametrize("kind", ALIAS_KINDS)
@pytest.mark.parametrize(
    "victim",
    ["output-data-as-report", "input-data-as-report", "input-data-as-output", "pattern-as-report", "input-as-report"],
)
def test_no_path_written_aliases_a_path_read_or_written(cli: WarmCli, tmp_path: Path, victim: str, kind: str) -> None:
    """The path-aliasing family: each written role against each read/written role, four spellings."""
    inputs, outputs, links = tmp_path / "in", tmp_path / "out", tmp_path / "links"
    for folder in (inputs, outputs, links, inputs / "sub", outputs / "sub"):
        folder.mkdir(exist_ok=True)
    model = _external_model(inputs)
    patterns = inputs / "rules.pdll"
    patterns.write_text("")
    out = outputs / "out.onnx"
    args: list[str | os.PathLike[str]] = ["optimize", model, "-q", "--patterns", patterns]
    if victim == "output-data-as-report":
        (outputs / "out.onnx.data").write_bytes(b"previous")  # a hard link needs something to link to
        args += ["-o", out, "--report", _alias(kind, outputs / "out.onnx.data", links)]
    elif victim == "input-data-as-report":
        args += ["-o", out, "--report", _alias(kind, inputs / "in.onnx.data", links)]
    elif victim == "input-data-as-output":
        args += ["-o", _alias(kind, inputs / "in.onnx.data", links)]
    elif victim == "pattern-as-report":
        args += ["-o", out, "--report", _alias(kind, patterns, links)]
    else:
        args += ["-o", out, "--report", _alias(kind, model, links)]
    before_in, before_out = _snapshot(inputs), _snapshot(outputs)
    result = cli.run(args, cwd=tmp_path)
    _assert_refused(result, "would overwrite")
    assert _snapshot(inputs) == before_in, "the input was modified"
    assert _snapshot(outputs) == before_out, "something was written"


def test_the_report_beside_a_model_with_external_data_is_written(cli: WarmCli, tmp_path: Path) -> None:
    """The check refuses aliases only: a report next to the output's data file is fine."""
    model = _external_model(tmp_path)
    out = tmp_path / "out.onnx"
    result = cli.run(["optimize", model, "-o", out, "--report", tmp_path / "out.json", "-q"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    np.testing.assert_allclose(_run(out), _run(model), rtol=1e-6)


# ------------------------------------------------------------------ -o IN --force


def test_replacing_the_input_in_place_keeps_it_loadable_at_every_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A kill after each rename of the replacement: IN is the old model with its outputs, or the new one."""
    from graphopt.api import optimize

    model = _external_model(tmp_path, value=0.5)
    expected = _run(model)
    real_replace = os.replace
    for crash_after in (1, 2):
        calls = []

        def crash(src, dst, crash_after=crash_after, calls=calls):  # type: ignore[no-untyped-def]
            real_replace(src, dst)
            if Path(dst).parent == tmp_path:  # a rename into place
                calls.append(Path(dst).name)
                if len(calls) == crash_after:
                    raise KeyboardInterrupt("killed")

        loaded = onnx_io.load_model(model)
        optimized, _ = optimize(loaded)
        monkeypatch.setattr(onnx_io.os, "replace", crash)
        with pytest.raises(KeyboardInterrupt):
            onnx_io.save_model(optimized, model)
        monkeypatch.setattr(onnx_io.os, "replace", real_replace)
        assert len(calls) == crash_after
        # Old model with its own data, or the new complete one: both compute the same.
        np.testing.assert_allclose(_run(model), expected, rtol=1e-6)
        read = onnx.load(str(model), load_external_data=False).graph.initializer[0].external_data
        location = next(entry.value for entry in read if entry.key == "location")
        assert location == ("in.onnx.data" if crash_after == 1 else "in.onnx.alt.data")  # old model, or the new one
    onnx_io.save_model(optimize(onnx_io.load_model(model))[0], model)
    np.testing.assert_allclose(_run(model), expected, rtol=1e-6)
    assert sorted(p.name for p in tmp_path.iterdir()) in (["in.onnx", "in.onnx.data"], ["in.onnx", "in.onnx.alt.data"])


def test_force_replaces_a_model_with_external_data_through_the_command_line(cli: WarmCli, tmp_path: Path) -> None:
    model = _external_model(tmp_path)
    expected = _run(model)
    for _ in range(3):  # the data file's name alternates; the one the replaced model read goes
        result = cli.run(["optimize", model, "-o", model, "--force", "-q"], cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        np.testing.assert_allclose(_run(model), expected, rtol=1e-6)
        assert len([p for p in tmp_path.iterdir() if p.name.endswith(".data")]) == 1


# ------------------------------------------------------------------ long names


def test_a_long_report_name_is_written_with_the_model(cli: WarmCli, tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    model = _external_model(tmp_path / "in")
    out_folder = tmp_path / "out"
    out_folder.mkdir()
    report = out_folder / ("r" * 245 + ".json")  # 250 characters: valid; its temporary name is longer
    out = out_folder / ("m" * 240 + ".onnx")  # its data file NAME.data is 250
    result = cli.run(["optimize", model, "-o", out, "--report", report, "-q"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert report.exists() and out.exists()
    np.testing.assert_allclose(_run(out), _run(model), rtol=1e-6)
    assert all(not p.name.startswith(".") for p in out_folder.iterdir())  # no staging left


@pytest.mark.parametrize("which", ["report", "output"])
def test_a_name_too_long_for_the_file_system_is_refused_before_anything_is_written(cli: WarmCli, tmp_path: Path, which: str) -> None:
    (tmp_path / "in").mkdir()
    model = _external_model(tmp_path / "in")
    out_folder = tmp_path / "out"
    out_folder.mkdir()
    long = "x" * 256 + (".json" if which == "report" else ".onnx")
    out = out_folder / (long if which == "output" else "m.onnx")
    report = out_folder / (long if which == "report" else "r.json")
    result = cli.run(["optimize", model, "-o", out, "--report", report, "-q"], cwd=tmp_path)
    _assert_refused(result, "long")
    assert list(out_folder.iterdir()) == []


# ------------------------------------------------------------------ user code


RELU_PDLL = "/// drop a Relu\nPattern DropRelu {\n  let r = op<Relu>(x);\n  Check(x);\n  replace r with x;\n}\nConstraint Check(x);\n"


def _user_patterns(folder: Path, python: str, pdll: str | None = RELU_PDLL) -> Path:
    patterns = folder / "patterns"
    patterns.mkdir()
    (patterns / "helpers.py").write_text(python)
    if pdll is not None:
        (patterns / "rules.pdll").write_text(pdll)
    return patterns


HELPER = "from graphopt.pattern.native import native_constraint\n\n@native_constraint('Check')\ndef check(ctx, x):\n"


USER_CODE_CASES = {
    "exit-on-import": ("import sys\nsys.exit(0)\n", ("helpers.py:2:", "sys.exit(0)")),
    "exit-on-import-no-code": ("raise SystemExit\n", ("helpers.py:1:", "sys.exit(None)")),
    "exit-while-matching": (HELPER + "    import sys\n    sys.exit(0)\n", ("helpers.py:6", "Constraint Check", "DropRelu", "sys.exit(0)")),
    "raises-while-matching": (HELPER + "    return 1 / 0\n", ("helpers.py:5", "Constraint Check", "ZeroDivisionError")),
}
#: `graphopt patterns` runs only import-time code: it matches nothing.
_CASES = [(c, n) for n in USER_CODE_CASES for c in ("optimize", "patterns") if c == "optimize" or "matching" not in n]


@pytest.mark.parametrize(("command", "name"), _CASES)
def test_user_code_that_exits_or_raises_is_an_error_with_its_file_and_line(cli: WarmCli, tmp_path: Path, command: str, name: str) -> None:
    python, needles = USER_CODE_CASES[name]
    model = _write(tmp_path, _relu_model())
    patterns = _user_patterns(tmp_path, python)
    out = tmp_path / "out.onnx"
    args: list[str | os.PathLike[str]] = ["optimize", model, "-o", out] if command == "optimize" else ["patterns"]
    result = cli.run([*args, "--patterns", patterns], cwd=tmp_path)
    _assert_refused(result, *needles)
    assert not out.exists()


def test_a_user_rule_named_like_a_built_in_one_needs_replace(cli: WarmCli, tmp_path: Path) -> None:
    model = _write(tmp_path, _relu_model())
    patterns = tmp_path / "patterns"
    patterns.mkdir()
    (patterns / "rules.pdll").write_text("Pattern FoldConvBatchNorm {\n  let r = op<Relu>(x);\n  replace r with x;\n}\n")
    out = tmp_path / "out.onnx"
    result = cli.run(["optimize", model, "-o", out, "--patterns", patterns], cwd=tmp_path)
    _assert_refused(result, "rules.pdll:1", "FoldConvBatchNorm", "built-in", "--replace FoldConvBatchNorm")
    result = cli.run(["optimize", model, "-o", out, "--patterns", patterns, "--replace", "FoldConvBatchNorm", "-q"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert [n.op_type for n in onnx.load(str(out)).graph.node] == ["Identity"] or len(onnx.load(str(out)).graph.node) < 1


def test_replace_without_a_rule_of_that_name_is_an_error(cli: WarmCli, tmp_path: Path) -> None:
    model = _write(tmp_path, _relu_model())
    result = cli.run(["optimize", model, "-o", tmp_path / "o.onnx", "--replace", "FoldConvBatchNorm"], cwd=tmp_path)
    _assert_refused(result, "--replace FoldConvBatchNorm")


@pytest.mark.parametrize("kind", ALIAS_KINDS)
def test_the_html_page_never_overwrites_its_json_report(cli: WarmCli, tmp_path: Path, kind: str) -> None:
    model = _write(tmp_path, _relu_model())
    report = tmp_path / "r.json"
    assert cli.run(["optimize", model, "-o", tmp_path / "o.onnx", "--report", report, "-q"], cwd=tmp_path).returncode == 0
    (tmp_path / "sub").mkdir()
    links = tmp_path / "links"
    links.mkdir()
    before = report.read_bytes()
    result = cli.run(["report", report, "-o", _alias(kind, report, links)], cwd=tmp_path)
    _assert_refused(result, "would overwrite")
    assert report.read_bytes() == before
