"""The `graphopt` command line.

    graphopt optimize IN -o OUT [--target T] [--patterns DIR]... [--enable RULE]...
                     [--disable RULE]... [--precision fp16|bf16] [--keep-fp32 OP_OR_NODE]...
                     [--precision-convs auto|low|fp32] [--layout auto|nchw|nhwc] [--tune] [--calibration-data FILE.npz]
                     [--weights int4|int8 [--block-size 32|64|128] [--weights-keep NAME_OR_GLOB]... [--weights-min-snr DB]]
                     [--verify] [--input-shape NAME=D1,D2]... [--report FILE.json|FILE.html] [--quiet] [--force]
    graphopt report REPORT.json [-o REPORT.html]
    graphopt explain MODEL [--rule NAME]... [--node NAME]... [--target T] [--patterns DIR]...
                     [--precision fp16|bf16] [--input-shape NAME=D1,D2]...
    graphopt diff A.onnx B.onnx [--json]
    graphopt patterns [--patterns DIR]...
    graphopt version

Exit codes: 0 success; 1 verification failed and could not be repaired (nothing is
written but the report); 2 a problem with the input, the options or the output
location, printed as one line `error: ...` on stderr (typer's own usage errors also
exit 2). No model file is written unless the whole run succeeds, and the input is
never modified unless it is also the output and `--force` is given.
"""

import gc
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

from graphopt import _dataclass_code

# Before typer and graphopt's modules define their dataclasses (graphopt/_dataclass_code.py).
_dataclass_code.install()

import typer  # noqa: E402

from graphopt.cli_blas import import_numpy_single_threaded  # noqa: E402
from graphopt.cli_checks import check_precision_options, is_html, output_path, parse_shapes  # noqa: E402
from graphopt.cli_command import GraphoptCommand as _Command  # noqa: E402
from graphopt.cli_command import GraphoptGroup  # noqa: E402
from graphopt.cli_paths import check_writable_folder, guard_paths, same_file  # noqa: E402
from graphopt.cli_weights import WEIGHTS_HELP, check_weight_options  # noqa: E402
from graphopt.errors import GraphoptError, printable  # noqa: E402

if TYPE_CHECKING:  # imported where used: `graphopt --help` must not pay for onnx-ir, sympy or rich
    import onnx_ir as ir

__all__ = ["app", "main", "run", "EXIT_OK", "EXIT_VERIFY_FAILED", "EXIT_USAGE"]

EXIT_OK = 0
EXIT_VERIFY_FAILED = 1
EXIT_USAGE = 2

app = typer.Typer(
    name="graphopt",
    cls=GraphoptGroup,
    help="A graph-rewrite optimizer for ONNX models.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    # Plain (click) help: typer's rich help imports rich's markdown and traceback modules,
    # which tripled the time of `graphopt --help`.
    rich_markup_mode=None,
)


def _fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    # One line, whatever the message: scripts grep for "error:". Multi-line messages (a
    # pattern error with its source excerpt) keep their first line, which names file:line:col.
    lines = [line.strip() for line in str(message).split("\n") if line.strip()]
    line = printable(lines[0]) if lines else "unknown error"
    print(f"error: {line}", file=sys.stderr, flush=True)
    raise typer.Exit(code)


@contextmanager
def _user_errors() -> Iterator[None]:
    """Turn the errors a user can cause into one line and exit code 2."""
    try:
        yield
    except GraphoptError as error:
        _fail(str(error))
    except OSError as error:
        where = f"{error.filename}: " if error.filename else ""
        _fail(f"{where}{error.strerror or error}")


def _quiet_libraries() -> None:
    # onnx-ir logs warnings about malformed graphs that our own checks report
    # better, as one line; keep its chatter off stderr.
    logging.getLogger("onnx_ir").setLevel(logging.ERROR)


#: --patterns runs the Python files it names: say so where the flag is documented.
PATTERNS_HELP = "Extra pattern file or folder (repeatable). Its .py files are imported and run: only pass code you trust."


_collection_paused = False  # main() paused the cyclic garbage collector for the start-up
#: The youngest generation's threshold while a command works on a model (Python's default: 700).
#: Loading the model and the rule library and rewriting make mostly objects that live until the
#: end; at 700, the collector ran ~30 times on a small model (~3 ms of CPU) to find little garbage.
#: Cycles the rewrites leave behind are still collected, every 100,000 new objects.
WORK_GC_THRESHOLD = 100_000


def _collect_from_here() -> None:
    """Resume the garbage collection main() paused for the start-up: the objects made so far
    (modules, classes, the libraries' tables) are frozen, so later collections skip them, and
    the young generation collected less often (WORK_GC_THRESHOLD; main() puts it back).
    Does nothing when the command runs without main() (a test's CliRunner, an embedding)."""
    global _collection_paused
    if _collection_paused:
        _collection_paused = False
        gc.freeze()
        gc.set_threshold(max(WORK_GC_THRESHOLD, gc.get_threshold()[0]), *gc.get_threshold()[1:])
        gc.enable()


# ------------------------------------------------------------------ progress


@contextmanager
def _progress(enabled: bool) -> Iterator[Callable[[str], None]]:
    """A spinner on stderr fed by OptimizeOptions.progress; silent when not on a terminal."""
    if not enabled:  # --quiet: not even rich is imported
        yield lambda message: None
        return
    from rich.console import Console
    from rich.markup import escape

    console = Console(stderr=True)
    if not console.is_terminal:
        yield lambda message: None
        return

    with console.status("loading", spinner="dots") as status:
        started = time.perf_counter()

        def say(message: str) -> None:
            status.update(f"{escape(message)} [dim]({time.perf_counter() - started:.1f}s)[/]")

        yield say


# ------------------------------------------------------------------ commands


@app.command(cls=_Command)
def optimize(
    model: Annotated[Path, typer.Argument(metavar="IN.onnx", help="The ONNX model to optimize.", show_default=False)],
    output_argument: Annotated[
        Path | None, typer.Argument(metavar="OUT.onnx", help="Where to write the optimized model (or -o OUT).", show_default=False)
    ] = None,
    output_option: Annotated[
        Path | None, typer.Option("--output", "-o", metavar="OUT", help="Where to write the optimized model.", show_default=False)
    ] = None,
    target: Annotated[
        str, typer.Option(metavar="TARGET", help="onnx (standard ops), ort-cpu or ort-cuda (onnxruntime's fused kernels).")
    ] = "onnx",
    patterns: Annotated[
        list[Path] | None, typer.Option("--patterns", metavar="DIR", help=PATTERNS_HELP)
    ] = None,
    replace: Annotated[
        list[str] | None,
        typer.Option("--replace", metavar="RULE", help="Let your rule of this name (from --patterns) replace the built-in one (repeatable)."),
    ] = None,
    enable: Annotated[list[str] | None, typer.Option("--enable", metavar="RULE", help="Apply only these rules (repeatable).")] = None,
    disable: Annotated[list[str] | None, typer.Option("--disable", metavar="RULE", help="Leave these rules out (repeatable).")] = None,
    precision: Annotated[
        str,
        typer.Option(
            metavar="fp16|bf16", help="Convert the model to this precision after the rewrites (inputs and outputs keep their types). fp8: the torch path only (refused here, saying why)."
        ),
    ] = "fp32",
    keep_fp32: Annotated[
        list[str] | None,
        typer.Option(
            "--keep-fp32", metavar="OP_OR_NODE", help="With --precision: also keep this op type, node or output name in float32 (repeatable)."
        ),
    ] = None,
    precision_convs: Annotated[
        str,
        typer.Option(
            "--precision-convs",
            metavar="auto|low|fp32",
            help="With --precision: the 2-D convolutions in the low type (low) or float32 (fp32); auto: converted where the cost table (or --tune) finds the low type faster on the target at every batch size the model allows (ort-cuda).",
        ),
    ] = "auto",
    precision_recurrent: Annotated[
        str,
        typer.Option(
            "--precision-recurrent",
            metavar="auto|low|fp32",
            help="With --precision: the recurrent ops (LSTM, GRU, RNN) in the low type (low) or float32 (fp32); auto: decided like the convolutions, from the cost table (or --tune), on ort-cuda.",
        ),
    ] = "auto",
    layout: Annotated[
        str,
        typer.Option(
            metavar="auto|nchw|nhwc",
            help="ort-cuda only: run Convs in NHWC (com.microsoft.NhwcConv, layout propagated) or keep NCHW; auto: decided per model from the cost table (or timed, with --tune).",
        ),
    ] = "auto",
    kv_buffer: Annotated[str, typer.Option("--kv-buffer", metavar="growing|shared", help=(
        "shared: GroupQueryAttention's past and present may be one max-length buffer (onnxruntime's past_present_share_buffer); "
        "the lengths are read from an attention_mask input (added if absent; ones over the valid tokens: a fixed "
        "[batch, max_length] mask runs under CUDA graphs)."))] = "growing",
    kv_max_length: Annotated[int | None, typer.Option("--kv-max-length", metavar="N", help=(
        "With --kv-buffer shared: the longest sequence (prompt + generated tokens) the buffer holds; the rotary tables "
        "become constants of N positions (as the onnxruntime-genai builder's caches) instead of being computed every step."))] = None,
    tune: Annotated[
        bool,
        typer.Option(
            "--tune",
            help="Time the candidates of each decision (layout, conv bias form, FusedConv, the convolutions' and the recurrent ops' precision) on the target's execution provider when present, and keep the faster (cached).",
        ),
    ] = False,
    calibration_data: Annotated[
        Path | None,
        typer.Option(
            "--calibration-data",
            metavar="FILE.npz",
            help="With --precision fp16: inputs (name -> array) on which the range check measures the float32 values (default: random inputs).",
        ),
    ] = None,
    weights: Annotated[str | None, typer.Option("--weights", metavar="int4|int8", help=WEIGHTS_HELP["weights"])] = None,
    block_size: Annotated[str, typer.Option("--block-size", metavar="32|64|128", help=WEIGHTS_HELP["block_size"])] = "32",
    weights_keep: Annotated[list[str] | None, typer.Option("--weights-keep", metavar="NAME_OR_GLOB", help=WEIGHTS_HELP["keep"])] = None,
    weights_min_snr: Annotated[str | None, typer.Option("--weights-min-snr", metavar="DB", help=WEIGHTS_HELP["min_snr"])] = None,
    weights_symmetric: Annotated[bool | None, typer.Option("--weights-symmetric/--weights-asymmetric", help=WEIGHTS_HELP["symmetric"])] = None,
    weights_accuracy_level: Annotated[
        str | None, typer.Option("--weights-accuracy-level", metavar="0-4", help=WEIGHTS_HELP["accuracy_level"])
    ] = None,
    verify: Annotated[
        bool, typer.Option("--verify", help="Compare original and optimized outputs in onnxruntime; leave out rewrites that change them.")
    ] = False,
    input_shape: Annotated[
        list[str] | None,
        typer.Option(
            "--input-shape",
            metavar="NAME=D1,D2,...",
            help="Fix an input's shape (and the symbolic dims it names) before optimizing, e.g. input_ids=1,128; "
            "the output model keeps it, --verify uses it (repeatable).",
        ),
    ] = None,
    report: Annotated[
        Path | None,
        typer.Option("--report", metavar="FILE.json|FILE.html", help="Write the rewrite report here: JSON, or an HTML page for a .html name."),
    ] = None,
    trace: Annotated[bool, typer.Option("--trace", help="Put every failed rule attempt (node, failing check) in the JSON report.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print nothing on success.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Allow the output to be the input model (replaced atomically).")] = False,
    strict: Annotated[
        bool, typer.Option("--strict", help="A rule whose own code fails stops the run (exit 2) instead of being skipped there with a warning.")
    ] = False,
    seed: Annotated[int, typer.Option(metavar="N", help="Seed of --verify's random inputs.")] = 0,
    max_repairs: Annotated[int, typer.Option(metavar="N", help="Rewrites --verify may leave out before giving up.", min=0)] = 5,
) -> None:
    """Optimize an ONNX model and write the result."""
    import_numpy_single_threaded()  # before onnx and onnx-ir import it (graphopt.cli_blas)
    with _user_errors():
        from graphopt.api import OptimizeOptions
        from graphopt.api import optimize as run_optimize
        from graphopt.ir.onnx_io import load_model, save_model
        from graphopt.ops.targets import get_target

        get_target(target)  # an unknown target is an error before any work
        precision_name = check_precision_options(precision, target, keep_fp32, precision_convs, precision_recurrent, layout, kv_buffer,
                                                 calibration_data)
        if kv_max_length is not None and (kv_buffer != "shared" or kv_max_length < 1):
            raise GraphoptError("--kv-max-length takes a length >= 1, with --kv-buffer shared")
        weight_options = check_weight_options(weights, block_size, weights_keep or [], weights_min_snr, weights_symmetric,
                                              weights_accuracy_level)
        output = output_path(output_argument, output_option)
        shapes = parse_shapes(input_shape or [])
        clash = sorted(set(enable or []) & set(disable or []))
        if clash:
            raise GraphoptError(f"--enable and --disable both name {', '.join(clash)}")
        check_writable_folder(output, "output")
        if report is not None:
            check_writable_folder(report, "report")
            if same_file(report, model) or os.path.realpath(report) in (os.path.realpath(model), os.path.realpath(output)):
                raise GraphoptError(f"{report}: the report would overwrite the input or the output model")
        with _progress(not quiet) as say:
            options = OptimizeOptions(
                target=target,
                patterns=[str(p) for p in patterns or []],
                replace=list(replace or []),
                enable=list(enable) if enable else None,
                disable=list(disable or []),
                trace=trace,
                snapshots=report is not None,  # only a written report shows them
                progress=say,
                precision=precision_name,
                keep_fp32=list(keep_fp32 or []),
                precision_convs=precision_convs,
                precision_recurrent=precision_recurrent,
                layout=layout,
                strict=strict,
                tune=tune,
                kv_buffer=kv_buffer,
                kv_max_length=kv_max_length,
                calibration_data=str(calibration_data) if calibration_data is not None else None,
                **weight_options,
            )
            say("loading")
            _collect_from_here()
            t0 = time.perf_counter()
            original = load_model(model)
            load_s = time.perf_counter() - t0
            pinned = None
            if shapes:
                from graphopt.explain import pin_input_shapes

                pinned = pin_input_shapes(original, shapes)
                options.shape_inference = True  # carry the fixed dims through the graph
            # Before optimizing: optimize() rewrites the model in place and may drop
            # references to the input's external data files.
            guard_paths(model, output, report, original, list(patterns or []), force)
            optimized, result = run_optimize(original, options)
            result.input_shapes = pinned
            result.input_path = str(model)
            result.times_s["load"] = load_s
            verification = None
            if verify:
                from graphopt.verify import verify_and_repair

                def load_original() -> "ir.Model":  # as optimized: with the shapes fixed
                    original = load_model(model)
                    if shapes:
                        pin_input_shapes(original, shapes)
                    return original

                optimized, verification = verify_and_repair(
                    load_original, optimized, result, options, shapes, seed=seed, max_repairs=max_repairs
                )
            if verification is None or verification.passed:
                say("saving")
                result.output_path = str(output)
                t0 = time.perf_counter()
                save_model(optimized, output, reference=model)
                result.times_s["save"] = time.perf_counter() - t0
        # The report is written whenever the optimization ran, also when verification
        # failed: it is what explains the failure.
        if report is not None:
            if is_html(report):
                from graphopt.report.html import write_html

                write_html(result, report)
            else:
                from graphopt.report.render import write_json

                write_json(result, report)
    if verification is not None and not verification.passed:
        _fail(f"verification failed, nothing written: {verification.message}", EXIT_VERIFY_FAILED)
    if not quiet:  # rich (the summary's tables) is imported only to print
        from rich.console import Console
        from rich.markup import escape

        from graphopt.report.render import print_summary

        console = Console()
        print_summary(result, console, json_report=report)
        console.print(f"wrote {escape(str(output))}" + (f" and {escape(str(report))}" if report else ""), highlight=False)


@app.command("report", cls=_Command)
def render_report(
    report_json: Annotated[Path, typer.Argument(metavar="REPORT.json", help="A JSON report written by `optimize --report`.", show_default=False)],
    output: Annotated[
        Path | None, typer.Option("--output", "-o", metavar="OUT.html", help="Where to write the page (default: REPORT.html beside it).")
    ] = None,
) -> None:
    """Render a saved JSON report as one self-contained HTML page (opens offline)."""
    from graphopt.report.document import load_report_document
    from graphopt.report.html import write_html

    output = output or report_json.with_suffix(".html")
    _collect_from_here()
    with _user_errors():
        from graphopt.paths import check_no_aliases

        check_no_aliases([(output, "page")], [(report_json, "the JSON report")])  # links and hard links too
        document = load_report_document(report_json)
        check_writable_folder(output, "output")
        write_html(document, output)
    print(f"wrote {output}")


@app.command("patterns", cls=_Command)
def list_patterns(
    patterns: Annotated[
        list[Path] | None, typer.Option("--patterns", metavar="DIR", help=PATTERNS_HELP)
    ] = None,
    builtin: Annotated[bool, typer.Option("--builtin/--no-builtin", help="Include the built-in library.")] = True,
) -> None:
    """List every rule (with its one-line doc and source file:line) and the native helpers."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from graphopt.api import OptimizeOptions, select_rules
    from graphopt.pattern.native import registered

    with _user_errors():
        rules = select_rules(OptimizeOptions(patterns=[str(p) for p in patterns or []], builtin=builtin))
    natives = registered()
    console = Console()
    if console.is_terminal:
        table = Table(title=f"{len(rules)} rules", title_justify="left")
        table.add_column("rule")
        table.add_column("source")
        table.add_column("benefit", justify="right")
        table.add_column("does")
        for rule in rules:
            table.add_row(escape(rule.name), escape(_short(rule.loc)), str(rule.effective_benefit), escape(rule.doc))
        console.print(table)
        helpers = Table(title=f"{len(natives)} native helpers", title_justify="left")
        helpers.add_column("kind")
        helpers.add_column("name")
        helpers.add_column("source")
        for native in natives:
            helpers.add_row(native.kind, escape(native.name), escape(_short(native.source)))
        console.print(helpers)
        return
    # Piped: plain tab-separated lines under a header, one per entry, never wrapped.
    print("kind\tname\tsource\tdoc")
    for rule in rules:
        print(f"rule\t{rule.name}\t{_short(rule.loc)}\t{rule.doc}")
    for native in natives:
        print(f"{native.kind.lower()}\t{native.name}\t{_short(native.source)}\t")


@app.command("ops", cls=_Command)
def list_ops() -> None:
    """List graphopt's own fused ops as the op registry declares them: inputs, attributes
    with their defaults, and what each target runs them as (graphopt/ops/fused_ops.py)."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from graphopt.ops import registry
    from graphopt.pattern.ir import MISSING

    try:
        import graphopt.ops.torch_lowering  # noqa: F401 - registers the torch lowerings
    except Exception:  # noqa: BLE001 - without torch, the torch column stays empty
        pass
    rows = []
    for op in registry.graphopt_ops():
        inputs = ", ".join(f"{i.name}?" if i.optional else i.name for i in op.inputs)
        attrs = ", ".join(a.name if a.default is MISSING else f"{a.name}={a.default}" for a in op.attributes)
        lowered = "; ".join(f"{t}: {low.domain + '.' if low.domain else ''}{low.op_type}" for t, low in op.lowerings.items())
        torch_low = registry.torch_lowerings().get(op.name)
        torch_text = "" if torch_low is None else ", ".join(torch_low.custom_ops) or "aten"
        rows.append((op.name, inputs, attrs, lowered, torch_text, op.doc))
    console = Console()
    if console.is_terminal:
        table = Table(title=f"{len(rows)} graphopt ops", title_justify="left")
        for column in ("op", "inputs", "attributes", "onnx targets", "torch", "does"):
            table.add_column(column)
        for row in rows:
            table.add_row(*map(escape, row))
        console.print(table)
        return
    print("op\tinputs\tattributes\tonnx targets\ttorch\tdoes")
    for row in rows:
        print("\t".join(row))


def _short(location: Any) -> str:
    """file:line[:col]: built-in rules relative to the library (rules/...), others to the current folder."""
    from graphopt.library import display_source

    return display_source(location)


@app.command("explain", cls=_Command)
def explain_rules(
    model: Annotated[Path, typer.Argument(metavar="MODEL.onnx", help="The ONNX model to explain (it is not modified).", show_default=False)],
    rule: Annotated[list[str] | None, typer.Option("--rule", metavar="NAME", help="Only this rule (repeatable).")] = None,
    node: Annotated[
        list[str] | None, typer.Option("--node", metavar="NAME", help="Only sites whose tried subgraph contains this node (repeatable).")
    ] = None,
    target: Annotated[str, typer.Option(metavar="TARGET", help="onnx, ort-cpu or ort-cuda, as for optimize.")] = "onnx",
    patterns: Annotated[
        list[Path] | None, typer.Option("--patterns", metavar="DIR", help=PATTERNS_HELP)
    ] = None,
    precision: Annotated[str, typer.Option(metavar="fp16|bf16", help="The precision optimize would convert to (it changes what fuses).")] = "fp32",
    input_shape: Annotated[
        list[str] | None,
        typer.Option("--input-shape", metavar="NAME=D1,D2,...", help="Pin an input's shape (and the symbolic dims it names) first (repeatable)."),
    ] = None,
    details: Annotated[
        bool, typer.Option("--details", help="One line per site (default with --rule or --node); otherwise sites with the same outcome share a line.")
    ] = False,
) -> None:
    """Say, for each rule and each node it could start at, why it applied or which check failed. Writes nothing."""
    import_numpy_single_threaded()
    from rich.console import Console

    from graphopt.api import OptimizeOptions
    from graphopt.explain import explain, print_explanation
    from graphopt.ops.targets import get_target
    from graphopt.passes.precision_plan import parse_precision

    _collect_from_here()
    with _user_errors():
        get_target(target)
        options = OptimizeOptions(target=target, patterns=[str(p) for p in patterns or []], precision=parse_precision(precision))
        explanation = explain(model, options, rules=list(rule or []), nodes=list(node or []), input_shapes=parse_shapes(input_shape or []))
    print_explanation(explanation, Console(), details=True if details else None)


@app.command("diff", cls=_Command)
def diff_models(
    a: Annotated[Path, typer.Argument(metavar="A.onnx", help="The model before (e.g. the input of optimize).", show_default=False)],
    b: Annotated[Path, typer.Argument(metavar="B.onnx", help="The model after (e.g. optimize's output).", show_default=False)],
    as_json: Annotated[bool, typer.Option("--json", help="Print the difference as JSON.")] = False,
) -> None:
    """Nodes removed, added and changed from A to B, grouped by the rewrite that made them where B says so."""
    import_numpy_single_threaded()
    import json

    from rich.console import Console

    from graphopt.diff import diff_files, print_diff

    _collect_from_here()
    with _user_errors():
        result = diff_files(a, b)
    if as_json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print_diff(result, Console())


def _version_line() -> str:
    # Package metadata, not imports: importing onnx-ir and onnxruntime takes most of a second.
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    from graphopt import __version__

    def of(package: str) -> str:
        try:
            return installed(package)
        except PackageNotFoundError:
            return "not installed"

    libraries = ", ".join(f"{name} {of(name)}" for name in ("onnx", "onnx-ir", "onnxruntime"))
    return f"graphopt {__version__} ({libraries})"


@app.command(cls=_Command)
def version() -> None:
    """Print graphopt's version and those of the libraries it runs on."""
    print(_version_line())


def _print_version(value: bool) -> None:
    if value:
        print(_version_line())
        raise typer.Exit()


@app.callback()
def _options(
    show_version: Annotated[
        bool, typer.Option("--version", help="Print graphopt's version and exit.", callback=_print_version, is_eager=True)
    ] = False,
) -> None:
    """A graph-rewrite optimizer for ONNX models."""


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    _quiet_libraries()
    global _collection_paused
    collecting = gc.isenabled()
    threshold = gc.get_threshold()  # _collect_from_here raises the youngest generation's
    # Start-up imports some 500 modules: objects that live until exit and no garbage, yet
    # the cyclic collector walked them again and again (some 0.045 s of CPU of a small
    # model's 0.5 s). A command that works on a model turns collection back on once its
    # libraries are in (_collect_from_here): a model's rewrites do leave cycles behind.
    gc.disable()
    _collection_paused = collecting
    try:
        app(args=argv, prog_name="graphopt")
    finally:
        _collection_paused = False
        # The process ends here. Shutting the interpreter down runs the cyclic garbage
        # collector over every object the imported libraries made (some 60,000): frozen,
        # they are skipped, which saves some 0.08 s of CPU on a small model's half second.
        # (Objects still in reference cycles then go without finalizers, which Python
        # never promises at exit; graphopt closes its files and removes its staging folders.)
        gc.freeze()
        gc.set_threshold(*threshold)
        if collecting:
            gc.enable()


def run() -> NoReturn:
    """The `graphopt` program (console script, `python -m graphopt`): main(), then the
    process ends without the interpreter's teardown where that is safe (graphopt.cli_exit)."""
    from graphopt.cli_exit import exit_process

    try:
        main()
    except SystemExit as error:
        _dataclass_code.save()  # only when this run compiled dataclass methods the table lacked
        exit_process(error)
    _dataclass_code.save()
    exit_process(SystemExit(0))


if __name__ == "__main__":
    run()
