"""The command line's habits (issue 19): what users of onnxsim, onnxruntime's tools and
Polygraphy expect, on the README's example model (a small ResNet-style CNN)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from conftest import run_cli

import graphopt

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("example") / "model.onnx"
    subprocess.run([sys.executable, str(REPO / "examples" / "make_example.py"), str(path)], check=True, capture_output=True)
    return path


def test_version_option() -> None:
    result = run_cli("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"graphopt {graphopt.__version__} (onnx ")
    assert run_cli("version").stdout == result.stdout


@pytest.mark.parametrize("command", [[], ["optimize"], ["explain"], ["patterns"], ["diff"], ["report"]])
def test_help_has_no_type_placeholders(command: list[str]) -> None:
    result = run_cli(*command, "--help")
    assert result.returncode == 0, result.stderr
    assert not re.search(r"<(bool|int|path|text|int range)>", result.stdout), result.stdout
    assert "{" not in result.stdout.splitlines()[0]  # the usage line


def test_optimize_usage_line_names_the_files() -> None:
    usage = run_cli("optimize", "--help").stdout.splitlines()[0]
    assert usage == "Usage: graphopt optimize [OPTIONS] IN.onnx [OUT.onnx]"


def test_output_as_second_argument(example: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.onnx"
    result = run_cli("optimize", example, out, "-q")
    assert result.returncode == 0, result.stderr
    assert len(onnx.load(out).graph.node) < len(onnx.load(example).graph.node)
    # The same file twice is fine; two different outputs, or none, are errors.
    assert run_cli("optimize", example, out, "-o", out, "-q").returncode == 0
    for args in ([example, out, "-o", tmp_path / "other.onnx"], [example]):
        result = run_cli("optimize", *args)
        assert result.returncode == 2 and result.stderr.startswith("error: ") and "output" in result.stderr
    assert not (tmp_path / "other.onnx").exists()


def test_input_shape_without_verify_fixes_dims(example: Path, tmp_path: Path) -> None:
    out, report = tmp_path / "fixed.onnx", tmp_path / "r.json"
    result = run_cli("optimize", example, out, "--input-shape", "image=2,3,64,64", "--report", report)
    assert result.returncode == 0, result.stderr
    assert "input shapes fixed: image=2,3,64,64 (symbolic dims N=2)" in result.stdout
    model = onnx.load(out)
    assert [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim] == [2, 3, 64, 64]
    assert model.graph.output[0].type.tensor_type.shape.dim[0].dim_value == 2  # N=2 everywhere
    document = json.loads(report.read_text())
    assert document["input_shapes"] == {"inputs": {"image": [2, 3, 64, 64]}, "symbols": {"N": 2}}
    # With --verify the fixed shapes are what it runs.
    verified = run_cli("optimize", example, tmp_path / "v.onnx", "--input-shape", "image=2,3,64,64", "--verify")
    assert verified.returncode == 0 and "verification: passed" in verified.stdout


def test_enable_and_disable_the_same_rule_is_an_error(example: Path, tmp_path: Path) -> None:
    result = run_cli("optimize", example, tmp_path / "o.onnx", "--enable", "FoldConvBatchNorm", "--disable", "FoldConvBatchNorm")
    assert result.returncode == 2
    assert result.stderr.strip() == "error: --enable and --disable both name FoldConvBatchNorm"
    assert not (tmp_path / "o.onnx").exists()


def test_summary_on_target_onnx(example: Path, tmp_path: Path) -> None:
    result = run_cli("optimize", example, tmp_path / "o.onnx")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    rules = out[out.index("Rewrites by rule"):out.index("other rules were tried")]
    assert "FoldConvBatchNorm" in rules and "FuseConvActivation" not in rules  # tried, never applied: not listed
    # "target onnx has no lowering for graphopt.FusedConv" once, as a summary line, not per node.
    assert out.count("has no lowering for graphopt.FusedConv") == 1
    assert re.search(r"\d+ matches not applied, target onnx has no lowering for graphopt.FusedConv \(FuseConvActivation ×\d+", out)
    assert "in the JSON report" not in out and "--report FILE.json lists them all" in out
    with_report = run_cli("optimize", example, tmp_path / "o.onnx", "--report", tmp_path / "r.json")
    assert f"more near-misses in {tmp_path / 'r.json'}" in with_report.stdout


def test_patterns_has_a_header_and_library_paths() -> None:
    result = run_cli("patterns", cwd=Path("/"))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "kind\tname\tsource\tdoc"
    sources = [line.split("\t")[2] for line in lines[1:]]
    assert sources and all(source.startswith("rules/") for source in sources), sources[:5]


def test_explain_groups_sites_and_details_on_request(example: Path) -> None:
    summary = run_cli("explain", example)
    details = run_cli("explain", example, "--details")
    assert summary.returncode == details.returncode == 0, summary.stderr + details.stderr
    assert len(summary.stdout.splitlines()) < 0.6 * len(details.stdout.splitlines())
    hints = [line.strip() for line in summary.stdout.splitlines() if line.strip().startswith("hint:")]
    assert len(hints) == len(set(hints))  # each hint once
    # FoldConvBatchNorm's 11 rewrites share a line; --details has one per site.
    assert re.search(r"applied +.*: 11 rewrites \(#", summary.stdout)
    assert sum(1 for line in details.stdout.splitlines() if re.match(r"\s+applied\s+\S+\.bn: rewrite #", line)) == 11
    assert "--details lists each one" in summary.stdout


def test_layout_help_matches_what_auto_does(example: Path, tmp_path: Path) -> None:
    # auto is a decision per model (graphopt.decisions), as the help says; the report shows it.
    help_text = " ".join(run_cli("optimize", "--help").stdout.split())
    assert "auto: decided per model from the cost table (or timed, with --tune)" in help_text
    report = tmp_path / "r.json"
    assert run_cli("optimize", example, tmp_path / "o.onnx", "--target", "ort-cuda", "--report", report, "-q").returncode == 0
    doc = json.loads(report.read_text())
    (layout,) = [d for d in doc["decisions"] if d["kind"] == "layout"]
    assert doc["layout"]["mode"] == ("nhwc" if layout["chosen"].startswith("nhwc") else "nchw")


def test_cli_docs_cover_every_optimize_option() -> None:
    docs = (REPO / "docs" / "cli.md").read_text()
    options = set(re.findall(r"(--[a-z][a-z0-9-]+)", run_cli("optimize", "--help").stdout)) - {"--help"}
    documented = set(re.findall(r"`[^`]*?(--[a-z][a-z0-9-]+)", docs))
    missing = sorted(options - documented)
    assert not missing, f"docs/cli.md does not document {missing}"


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_report_files_respect_the_umask(tmp_path: Path, mask: int, mode: int) -> None:
    from graphopt.report.model import Report
    from graphopt.report.render import write_json

    old = os.umask(mask)
    try:
        write_json(Report(target="onnx"), tmp_path / "r.json")
    finally:
        os.umask(old)
    assert (tmp_path / "r.json").stat().st_mode & 0o777 == mode


@pytest.mark.parametrize("target", ["onnx", "ort-cpu"])
def test_node_names_stay_the_users(example: Path, tmp_path: Path, target: str) -> None:
    # Surviving nodes keep their names (a Conv folded with its BatchNormalization stays
    # `layer1.a.conv`); nodes a rewrite made get short names derived from the node they
    # stand in for (`fc.add_1`), never chains like `layer3.c.conv__go9__go12`.
    out = tmp_path / "o.onnx"
    assert run_cli("optimize", example, out, "--target", target, "-q").returncode == 0
    before = {n.name: n.op_type for n in onnx.load(example).graph.node}
    names = [n.name for n in onnx.load(out).graph.node]
    assert len(names) == len(set(names))
    for name in names:
        assert name in before or re.fullmatch(r"(.+)_\d+", name) and re.fullmatch(r"(.+)_\d+", name).group(1) in before, name  # type: ignore[union-attr]
    if target == "onnx":
        assert "layer1.a.conv" in names and "fc.add_1" in names
    values = [v.name for v in onnx.load(out).graph.initializer]
    assert not any("__go" in name for name in names + values)


def test_every_link_in_the_docs_stays_in_the_repository() -> None:
    # A user's clone has only the repository: README and docs link nothing outside it.
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if re.match(r"[a-z]+://", target):
                continue
            resolved = (page.parent / target).resolve()
            assert resolved.is_relative_to(REPO) and resolved.exists(), f"{page.name}: {target}"
    assert "(docs/design.md)" in (REPO / "README.md").read_text()
    design = (REPO / "docs" / "design.md").read_text()
    assert "## Decisions by measurement" in design and "## Habits taken from the anchors" in design


HEAVY = ("onnx", "onnx_ir", "sympy", "torch", "onnxruntime", "numpy", "rich", "pydantic")


@pytest.mark.parametrize(
    "code",
    [
        "import graphopt",
        "import sys; sys.argv = ['graphopt', '--help']\nfrom graphopt.cli import main\ntry:\n    main()\nexcept SystemExit:\n    pass",
        "import sys; sys.argv = ['graphopt', '--version']\nfrom graphopt.cli import main\ntry:\n    main()\nexcept SystemExit:\n    pass",
    ],
    ids=["import", "help", "version"],
)
def test_start_up_imports_nothing_heavy(code: str) -> None:
    # Start-up time is import time: these must not pull in the optimizer's libraries
    # (the times themselves are in benchmarks/RESULTS.md, measured by benchmarks/startup.py).
    probe = code + f"\nimport sys\nprint('HEAVY:' + ','.join(sorted(m for m in {HEAVY!r} if m in sys.modules)))"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, cwd=REPO)
    assert done.returncode == 0, done.stderr
    heavy = [line for line in done.stdout.splitlines() if line.startswith("HEAVY:")]
    assert heavy == ["HEAVY:"], heavy
