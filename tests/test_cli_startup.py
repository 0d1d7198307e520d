"""Start-up of the command line (issue 19): parameter values converted without pydantic, as
typer converts them, and the optimize command importing only what it needs.
The times are benchmarks' business (benchmarks/startup.py); these tests guard the means."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import typer
from conftest import run_cli

import graphopt.pattern.native as native_module
from graphopt.cli import app
from graphopt.cli_command import plain_converter
from graphopt.pattern.native import Value as NativeValue

REPO = Path(__file__).resolve().parent.parent

coercion = pytest.importorskip("typer._coercion", reason="typer < 0.29 converts through click, without pydantic")


def _parameters() -> list[tuple[str, Any]]:
    group = typer.main.get_command(app)
    ctx = group.make_context("graphopt", ["version"])
    found = [("graphopt", param) for param in group.params] + [("graphopt", group.get_help_option(ctx))]
    for name, command in group.commands.items():
        found += [(name, param) for param in command.params]
        found.append((name, command.get_help_option(command.make_context(name, [], resilient_parsing=True))))
    return found


PARAMETERS = _parameters()
SAMPLES: dict[Any, list[Any]] = {
    str: ["onnx", "", " spaced ", "ü", "--odd"],
    int: [0, 5, "0", "7", "-1", "123456", "007", " 5", "+5", "1_000", "1.0", "x"],
    bool: [True, False],
    Path: ["model.onnx", "", "-", "~/a b/c.onnx", "a/../b.onnx", "/"],
}


def _kind(annotation: Any) -> Any:
    return typer._typing.get_args(annotation)[0] if typer._typing.get_origin(annotation) is list else annotation


def _convert(runtime: Any, value: Any, param: Any, ctx: Any) -> tuple[str, Any]:
    try:
        return "value", runtime.coerce(value, param=param, ctx=ctx)
    except typer._click.exceptions.BadParameter as error:
        return "error", error.format_message()


def test_every_parameter_of_every_command_has_the_plain_converter() -> None:
    # A parameter typer gives a pydantic adapter brings pydantic back into the start-up.
    missing = [f"{command} {param.name}" for command, param in PARAMETERS if type(param._runtime_param).__name__ != "_PlainRuntimeParam"]
    assert not missing, missing
    assert len(PARAMETERS) > 40


@pytest.mark.parametrize("command,param", PARAMETERS, ids=[f"{c}-{p.name}" for c, p in PARAMETERS])
def test_plain_converter_gives_what_typer_gives(command: str, param: Any) -> None:
    # Every sample value, plain or not: the same value (type included) or the same error
    # message as typer's own pydantic converter.
    ctx = typer.main.get_command(app).make_context("graphopt", ["version"])
    ours = param._runtime_param
    theirs = coercion.build_runtime_param(param.type_descriptor)
    assert type(ours).__name__ == "_PlainRuntimeParam"
    kind = _kind(param.type_descriptor.annotation)
    listed = typer._typing.get_origin(param.type_descriptor.annotation) is list
    values = SAMPLES[kind] + [None]
    if listed:
        values = [(), tuple(SAMPLES[kind][:3]), None]
    for value in values:
        expected = _convert(theirs, value, param, ctx)
        got = _convert(ours, value, param, ctx)
        assert got == expected, (value, got, expected)
        assert type(got[1]) is type(expected[1]), value
        if listed and got[1]:
            assert [type(item) for item in got[1]] == [type(item) for item in expected[1]]


def test_max_repairs_range_checked_as_before() -> None:
    param = next(p for c, p in PARAMETERS if c == "optimize" and p.name == "max_repairs")
    ctx = typer.main.get_command(app).make_context("graphopt", ["version"])
    kind, message = _convert(param._runtime_param, "-1", param, ctx)
    assert kind == "error" and "greater than or equal to 0" in message, message


def test_plain_converter_leaves_other_kinds_to_typer() -> None:
    class Special:
        pass

    descriptor = coercion.resolve_type_descriptor(float, typer.models.OptionInfo())
    param = type("P", (), {"_runtime_param": None, "type_descriptor": descriptor})()
    assert plain_converter(param) is None  # float: pydantic's number reading stays
    descriptor = coercion.resolve_type_descriptor(int, typer.models.OptionInfo(clamp=True, min=0))
    param.type_descriptor = descriptor
    assert plain_converter(param) is None  # clamped numbers: typer's
    param._runtime_param = object()
    assert plain_converter(param) is None  # already has one


def test_bad_values_still_get_typers_messages(tmp_path: Path) -> None:
    result = run_cli("optimize", "in.onnx", "-o", "out.onnx", "--seed", "x", cwd=tmp_path)
    assert result.returncode == 2
    assert "Invalid value for '--seed'" in result.stderr, result.stderr
    result = run_cli("optimize", "in.onnx", "-o", "out.onnx", "--max-repairs", "-2", cwd=tmp_path)
    assert result.returncode == 2
    assert "Invalid value for '--max-repairs'" in result.stderr and "greater than or equal to 0" in result.stderr, result.stderr


# Not needed to optimize a model file to file with the default options.
NOT_FOR_OPTIMIZE = (
    "pydantic", "torch", "sympy", "rich", "scipy", "statistics", "graphopt.report.html", "graphopt.verify",
    "graphopt.passes.precision_plan", "graphopt.passes.weight_quant", "graphopt.passes.kv_buffer", "graphopt.quant.fp8_onnx",
    "graphopt.decisions", "onnx_ir.passes.common", "graphopt.report.sections",
    # OpenSSL's libcrypto (graphopt._digest takes its digests from CPython's builtin modules);
    # the rewrites' snapshots (only drawn in a written report).
    "hashlib", "_hashlib", "graphopt.report.snapshot",
    # The fast paths of big single-file models (a 245 KB model is read by onnx-ir's ordinary parse).
    "graphopt.ir.fast_io", "graphopt.ir.fast_save", "graphopt.ir.protobuf_wire",
    # onnx's __version__ is read from its METADATA file (graphopt._lazy_onnx), not through
    # importlib.metadata and the email parser it brings; onnx.utils and onnx.gen_proto (with
    # tarfile and argparse) are imported on first use.
    "importlib.metadata", "email.parser", "onnx.utils", "onnx.gen_proto", "tarfile", "argparse",
)


def test_the_onnx_target_has_no_decisions_to_make() -> None:
    # graphopt.api skips graphopt.decisions for the onnx target without precision or weights on this ground
    from graphopt.decisions import EP_OF_TARGET

    assert "onnx" not in EP_OF_TARGET and {"ort-cpu", "ort-cuda"} <= set(EP_OF_TARGET)


def test_optimize_imports_only_what_it_needs(tmp_path: Path) -> None:
    model = tmp_path / "model.onnx"
    subprocess.run([sys.executable, str(REPO / "examples" / "make_example.py"), str(model)], check=True, capture_output=True)
    probe = (
        "import sys\nfrom graphopt.cli import main\n"
        f"sys.argv = ['graphopt', 'optimize', {str(model)!r}, '-o', {str(tmp_path / 'out.onnx')!r}, '-q']\n"
        "try:\n    main()\nexcept SystemExit as exit:\n    assert not exit.code, exit.code\n"
        f"print('HEAVY:' + ','.join(sorted(m for m in {NOT_FOR_OPTIMIZE!r} if m in sys.modules)))"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out.onnx").is_file()
    heavy = [line for line in done.stdout.splitlines() if line.startswith("HEAVY:")]
    assert heavy == ["HEAVY:"], heavy


# ------------------------------------------------------------------ the quick exit (graphopt.cli_exit)


@pytest.mark.parametrize("code,status", [(None, 0), (0, 0), (2, 2), (1, 1), (256 + 3, 3), (-1, 255), ("message", None), (True, 1), (1 << 40, None)])
def test_exit_code_as_python_would_give_it(code: Any, status: int | None) -> None:
    from graphopt.cli_exit import exit_code

    assert exit_code(SystemExit(code)) == status


def test_quick_exit_runs_atexit_and_delivers_all_output(tmp_path: Path) -> None:
    # A --patterns file's atexit function still runs (it writes a file), the summary on
    # stdout arrives whole through a pipe, and the exit status is the command's.
    model = tmp_path / "model.onnx"
    subprocess.run([sys.executable, str(REPO / "examples" / "make_example.py"), str(model)], check=True, capture_output=True)
    marker = tmp_path / "atexit-ran"
    patterns = tmp_path / "exit_hook.py"
    patterns.write_text(
        "import atexit, pathlib\n"
        f"atexit.register(lambda: pathlib.Path({str(marker)!r}).write_text('yes'))\n"
        "from graphopt.pattern.python import op, replace, rule\n\n"
        "@rule\ndef ReluOfReluHook(x):\n    inner = op.Relu(x)\n    return replace(op.Relu(inner), op.Relu(x))\n"
    )
    result = run_cli("optimize", model, "-o", tmp_path / "out.onnx", "--patterns", patterns, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert marker.read_text() == "yes"
    assert result.stdout.rstrip().endswith(f"wrote {tmp_path / 'out.onnx'}"), result.stdout[-300:]
    assert not list(tmp_path.glob(".*staging*")) and not list(tmp_path.glob(".graphopt*")), list(tmp_path.iterdir())
    failed = run_cli("optimize", model, "-o", tmp_path / "missing" / "out.onnx", cwd=tmp_path)
    assert failed.returncode == 2 and failed.stderr.startswith("error: "), failed.stderr


def test_quick_exit_waits_for_other_threads(tmp_path: Path) -> None:
    # With a Python thread still running, the ordinary exit (which waits for it) is kept.
    # The thread prints only after the command is done, so it is alive when run() ends it.
    script = (
        "import sys, threading, time\nsys.argv = ['graphopt', '--version']\n"
        "import graphopt.cli as cli\ncommand_done = threading.Event()\nmain = cli.main\n"
        "def wrapped():\n    try:\n        main()\n    finally:\n        command_done.set()\n"
        "cli.main = wrapped\n"
        "def late():\n    command_done.wait()\n    time.sleep(0.2)\n    print('thread done', flush=True)\n"
        "threading.Thread(target=late).start()\ncli.run()\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("graphopt ") and done.stdout.rstrip().endswith("thread done"), done.stdout


def test_without_snapshots_the_same_model_and_report_but_the_drawings() -> None:
    # The command line records no snapshots when it writes no report (they are the HTML report's drawings).
    import onnx_ir as ir
    from conftest import conv_bn_model

    import graphopt

    model = conv_bn_model()  # random weights: one model for both runs (optimize leaves a ModelProto as it was)
    drawn, drawn_report = graphopt.optimize(model)
    plain, plain_report = graphopt.optimize(model, snapshots=False)
    assert drawn.SerializeToString() == plain.SerializeToString()
    rewrites = [r for stats in plain_report.rules.values() for r in stats.rewrites]
    assert rewrites and all(r.before is None and r.after is None for r in rewrites)
    assert all(r.before is not None for stats in drawn_report.rules.values() for r in stats.rewrites)
    assert drawn_report.total_rewrites == plain_report.total_rewrites
    assert [(r.rule, r.node, r.matched) for r in rewrites] == [
        (r.rule, r.node, r.matched) for stats in drawn_report.rules.values() for r in stats.rewrites
    ]
    assert isinstance(ir.serde.deserialize_model(plain), ir.Model)


# ------------------------------------------------------------------ typer's work per run


def test_command_annotations_are_objects_not_strings() -> None:
    # typer compiles and evaluates string annotations (`from __future__ import annotations`)
    # twice per command on every run: graphopt.cli's are evaluated once, at import.
    import inspect

    import graphopt.cli as cli

    commands = [info.callback for info in app.registered_commands] + [app.registered_callback.callback]
    assert len(commands) >= 8
    for command in commands:
        annotations = inspect.get_annotations(command)
        strings = [name for name, annotation in annotations.items() if isinstance(annotation, str)]
        assert not strings, (command.__name__, strings)
    assert cli.optimize.__annotations__["model"].__metadata__  # typer's Argument, as written


# ------------------------------------------------------------------ graphopt._digest


@pytest.mark.parametrize("data", [b"", b"graphopt", bytes(range(256)) * 33])
def test_digests_are_hashlibs(data: bytes) -> None:
    import hashlib

    from graphopt import _digest

    assert _digest.sha256(data).hexdigest() == hashlib.sha256(data).hexdigest()
    assert _digest.sha1(data).hexdigest() == hashlib.sha1(data).hexdigest()
    key = _digest.sha256()
    key.update(data)
    key.update(b"more")
    assert key.digest() == hashlib.sha256(data + b"more").digest()


# ------------------------------------------------------------------ onnx_view's attributes


@pytest.mark.parametrize(
    "value",
    [[1, 2, 3], (0, -1), [True, False], [1.5, 2.0], (0.0,), ["a", "b"], ("x",), 3, 2.5, "s", [1, 2.0], [], [float("nan")]],
    ids=repr,
)
def test_new_node_attributes_are_onnx_irs(value: Any) -> None:
    # The shortcut for lists must give the attribute onnx-ir's convert_attribute gives (or its error).
    import onnx_ir as ir

    from graphopt.ir.onnx_view import _attribute

    def made(convert: Any) -> Any:
        try:
            attribute = convert("a", value)
        except TypeError as error:
            return ("error", str(error))
        return (type(attribute), attribute.type, repr(attribute.value))

    assert made(_attribute) == made(ir.convenience.convert_attribute)


# ------------------------------------------------------------------ native helpers' declared fields


def _typing_fields(cls: type) -> tuple[tuple[str, str], ...]:
    import dataclasses
    import typing

    hints = typing.get_type_hints(cls, include_extras=True)
    return tuple(
        (f.name, str(meta[0]) if (meta := getattr(hints.get(f.name), "__metadata__", ())) else "any") for f in dataclasses.fields(cls)
    )


def test_declared_fields_as_typing_resolves_them() -> None:
    # declared_fields resolves one-name annotations itself (typing.get_type_hints compiles each):
    # every built-in helper's params and results, and the forms it leaves to typing.
    from graphopt.api import builtin_rules
    from graphopt.pattern import native

    builtin_rules()
    classes = {cls for fn in native.registered() for cls in (fn.params, fn.results) if cls is not None}
    assert len(classes) >= 4
    for cls in classes:
        assert native.declared_fields(cls) == _typing_fields(cls), cls

    assert native.declared_fields(_Derived) == _typing_fields(_Derived) == (("a", "value"), ("b", "attr"), ("c", "any"), ("d", "any"))


@dataclass
class _Base:
    a: NativeValue
    b: native_module.Attr  # an expression: typing's


@dataclass
class _Derived(_Base):
    c: int = 0  # a builtin: not in the module
    d: list[NativeValue] | None = None
