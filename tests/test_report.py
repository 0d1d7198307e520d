"""The JSON report and its schema, and the terminal summary."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import onnx_ir as ir
import pytest
from conftest import conv_bn_model
from rich.console import Console

import graphopt
from graphopt.api import OptimizeOptions
from graphopt.report.model import SCHEMA_NAME, SCHEMA_VERSION, NearMiss, Report, RuleStats, Verification
from graphopt.report.render import print_summary, report_to_json, write_json
from graphopt.verify import verify_and_repair

REPO = Path(__file__).resolve().parent.parent
SCHEMA = json.loads((REPO / "graphopt" / "report" / "schema.json").read_text())
DOC = (REPO / "docs" / "report-schema.md").read_text()


# A small validator for the JSON Schema subset schema.json uses; jsonschema is used
# too when it happens to be installed, but graphopt does not depend on it.
def _validate(instance: Any, schema: dict[str, Any], root: dict[str, Any], path: str = "$") -> list[str]:
    if "$ref" in schema:
        target: Any = root
        for part in schema["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        return _validate(instance, target, root, path)
    errors: list[str] = []
    if "const" in schema and instance != schema["const"]:
        errors.append(f"{path}: {instance!r} != {schema['const']!r}")
    if "anyOf" in schema and all(_validate(instance, s, root, path) for s in schema["anyOf"]):
        errors.append(f"{path}: matches none of anyOf")
    if "type" in schema:
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        checks = {
            "object": lambda v: isinstance(v, dict),
            "array": lambda v: isinstance(v, list),
            "string": lambda v: isinstance(v, str),
            "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
            "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
            "boolean": lambda v: isinstance(v, bool),
            "null": lambda v: v is None,
        }
        if not any(checks[t](instance) for t in types):
            return [f"{path}: {instance!r} is not {types}"]
    if isinstance(instance, (int, float)) and not isinstance(instance, bool) and "minimum" in schema and instance < schema["minimum"]:
        errors.append(f"{path}: {instance} < {schema['minimum']}")
    if isinstance(instance, dict):
        for key in schema.get("required", []):
            if key not in instance:
                errors.append(f"{path}: missing {key!r}")
        props = schema.get("properties", {})
        for key, value in instance.items():
            if key in props:
                errors.extend(_validate(value, props[key], root, f"{path}.{key}"))
            elif isinstance(schema.get("additionalProperties"), dict):
                errors.extend(_validate(value, schema["additionalProperties"], root, f"{path}.{key}"))
    if isinstance(instance, list) and "items" in schema:
        for i, item in enumerate(instance):
            errors.extend(_validate(item, schema["items"], root, f"{path}[{i}]"))
    return errors


def validate(document: dict[str, Any]) -> None:
    errors = _validate(document, SCHEMA, SCHEMA)
    assert not errors, "\n".join(errors)
    try:
        import jsonschema
    except ImportError:
        return
    jsonschema.Draft202012Validator(SCHEMA).validate(document)


def _undocumented(document: Any, schema: dict[str, Any], path: str = "$") -> list[str]:
    """Fields the report has that the schema does not describe (schema drift)."""
    if "$ref" in schema:
        target: Any = SCHEMA
        for part in schema["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        return _undocumented(document, target, path)
    if "anyOf" in schema:
        return min((_undocumented(document, s, path) for s in schema["anyOf"] if not _validate(document, s, SCHEMA)), key=len, default=[])
    missing = []
    if isinstance(document, dict) and "properties" in schema:
        for key, value in document.items():
            if key not in schema["properties"]:
                missing.append(f"{path}.{key}")
            else:
                missing.extend(_undocumented(value, schema["properties"][key], f"{path}.{key}"))
    if isinstance(document, list) and "items" in schema:
        for item in document:
            missing.extend(_undocumented(item, schema["items"], f"{path}[]"))
    return missing


@pytest.fixture(scope="module")
def verified_report() -> Report:
    proto = conv_bn_model()
    options = OptimizeOptions()
    optimized, report = graphopt.optimize(ir.serde.deserialize_model(proto), options)
    verify_and_repair(lambda: ir.serde.deserialize_model(proto), optimized, report, options)
    return report


def test_real_report_matches_schema(verified_report: Report) -> None:
    document = json.loads(report_to_json(verified_report))
    validate(document)
    assert document["schema"] == SCHEMA_NAME and document["version"] == SCHEMA_VERSION
    assert _undocumented(document, SCHEMA) == []


def test_report_has_applications_and_near_misses(verified_report: Report) -> None:
    document = json.loads(report_to_json(verified_report))
    rules = {r["name"]: r for r in document["rules"]}
    fold = rules["FoldConvBatchNorm"]
    assert fold["applications"] == 2 and len(fold["rewrites"]) == 2
    assert {r["node"] for r in fold["rewrites"]} == {"bn1_out", "bn2_out"}
    assert re.search(r"conv_bn\.pdll:\d+", fold["source"])
    # conv3 takes its weights from a graph input: the fold rule gets there and fails on Const.
    misses = [m for m in fold["near_misses"] if m["node"] == "bn3"]
    assert misses and "constant" in misses[0]["reason"]
    assert document["total_rewrites"] == sum(r["applications"] for r in document["rules"])
    assert document["verification"]["passed"] is True
    assert document["before"]["ops"]["BatchNormalization"] == 3


def test_every_schema_field_is_documented() -> None:
    def fields(schema: dict[str, Any]) -> set[str]:
        names = set(schema.get("properties", {}))
        for sub in schema.get("$defs", {}).values():
            names |= fields(sub)
        return names

    for name in fields(SCHEMA):
        assert f"`{name}`" in DOC, f"docs/report-schema.md does not document `{name}`"


def test_empty_report_matches_schema() -> None:
    validate(json.loads(report_to_json(Report(target="onnx"))))


def test_non_finite_numbers_become_null() -> None:
    report = Report(target="onnx")
    report.verification = Verification(False, 1, {"y": float("inf")}, 1e-4, 1e-5, {"x": [1]}, message="m")
    document = json.loads(report_to_json(report))
    assert document["verification"]["max_abs_diff"] == {"y": None}
    validate(document)


def test_write_json_is_atomic(tmp_path: Path, verified_report: Report) -> None:
    path = tmp_path / "r.json"
    path.write_text("old")
    write_json(verified_report, path)
    assert json.loads(path.read_text())["schema"] == SCHEMA_NAME
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # no temporary file left behind


def test_write_json_leaves_nothing_when_it_cannot_write(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        write_json(Report(target="onnx"), tmp_path / "missing" / "r.json")
    assert list(tmp_path.iterdir()) == []


def _render(report: Report) -> str:
    buffer = io.StringIO()
    print_summary(report, Console(file=buffer, width=200, color_system=None))
    return buffer.getvalue()


def test_summary_shows_changes_rules_near_misses_and_verification(verified_report: Report) -> None:
    text = _render(verified_report)
    assert re.search(r"BatchNormalization\s*│\s*3\s*│\s*0\s*│\s*-3", text)
    assert "Identity" not in text  # unchanged op types are left out
    assert re.search(r"total\s*│\s*\d+\s*│\s*\d+", text)
    assert re.search(r"FoldConvBatchNorm\s*│\s*2\s*│", text)
    assert "Near-misses" in text and "bn3" in text
    assert "verification: passed" in text
    assert "time:" in text


def test_summary_escapes_markup() -> None:
    report = Report(target="onnx")
    stats = report.rule("[bold]Odd[/bold]", "x.pdll:1", 1)
    stats.attempts = 1
    stats.add_near_miss(NearMiss("[bold]Odd[/bold]", "main", "n", "Relu", "", "needs [Const]", 1))
    report.warnings.append("a [red]warning[/red]")
    text = _render(report)
    assert "[bold]Odd[/bold]" in text and "needs [Const]" in text and "a [red]warning[/red]" in text


def test_summary_of_a_rule_stats_only_report() -> None:
    report = Report(target="onnx")
    report.rules["R"] = RuleStats("R", "f.pdll:3", 1, attempts=0)
    assert "No rule was tried" in _render(report)


def _summary_report() -> Report:
    """Two rules tried at many nodes: R1 applied at n0 (after failing there in the first sweep),
    R2 never applied; R3 failed only because the target lacks its op."""
    from graphopt.report.model import RewriteRecord

    report = Report(target="onnx")
    r1 = report.rule("R1", "a.pdll:1", 1)
    r1.attempts, r1.matches, r1.applications = 30, 1, 1
    r1.rewrites.append(RewriteRecord(1, "R1", "main", "n0", "Relu", 1, ["Relu"], matched=["n0"]))
    r1.add_near_miss(NearMiss("R1", "main", "n0", "Relu", "", "'b' is not a constant", 3))
    for k in range(1, 20):
        r1.add_near_miss(NearMiss("R1", "main", f"m{k}", "Relu", "", f"check {k} failed", 2))
    r2 = report.rule("R2", "a.pdll:9", 1)
    r2.attempts = 4
    r2.add_near_miss(NearMiss("R2", "main", "x1", "Add", "", "expected Mul, got Add", 1))
    r3 = report.rule("R3", "a.pdll:20", 1)
    r3.attempts = r3.matches = 3
    for k in range(3):
        r3.add_near_miss(NearMiss("R3", "main", f"c{k}", "Conv", "", "target onnx has no lowering for graphopt.FusedConv", 2))
    report.rule("R4", "a.pdll:30", 1)  # loaded, never tried
    return report


def test_summary_lists_only_rules_that_applied() -> None:
    text = _render(_summary_report())
    table = text[text.index("Rewrites by rule"):text.index("other rules")]
    assert "R1" in table and "R2" not in table and "R3" not in table and "R4" not in table
    assert "2 other rules were tried and did not apply" in text
    report = Report(target="onnx")
    report.rule("R", "a.pdll:1", 1).attempts = 3
    assert "No rule applied (1 rules were tried)." in _render(report)


def test_summary_near_misses_target_gaps_resolved_and_more() -> None:
    text = _render(_summary_report())
    # The target gap is one line, not three rows.
    assert text.count("has no lowering for graphopt.FusedConv") == 1
    assert "3 matches not applied, target onnx has no lowering for graphopt.FusedConv (R3 ×3)" in text
    # R1's miss at n0 was resolved by a later sweep: not listed; its other misses are.
    assert "'b' is not a constant" not in text and "check " in text
    # No JSON report: say how to get one, not "in the JSON report".
    assert "more near-misses: --report FILE.json lists them all" in text and "in the JSON report" not in text
    buffer = io.StringIO()
    print_summary(_summary_report(), Console(file=buffer, width=200, color_system=None), json_report="out/r.json")
    assert "more near-misses in out/r.json" in buffer.getvalue()


def test_report_prints_its_summary() -> None:
    report = _summary_report()
    assert "Rewrites by rule" in str(report) and "R1" in str(report)
    assert report.one_line() == "target onnx: 1 rewrites (R1 1)"


def test_trace_lists_every_failed_attempt(tmp_path) -> None:
    import subprocess
    import sys

    import onnx
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Cast", ["r"], ["y"], to=TensorProto.DOUBLE)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])], [helper.make_tensor_value_info("y", TensorProto.DOUBLE, None)])
    src = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), src)
    out, report_path = tmp_path / "o.onnx", tmp_path / "r.json"
    done = subprocess.run([sys.executable, "-m", "graphopt", "optimize", str(src), "-o", str(out), "--report", str(report_path), "--trace", "--quiet"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    document = json.loads(report_path.read_text())
    attempts = sum(rule["attempts"] - rule["matches"] for rule in document["rules"])
    assert len(document["trace"]) == attempts > 0
    assert {entry["rule"] for entry in document["trace"]} >= {"DropNoOpCast", "CollapseCastChain"}
    assert any("casts f32 to f64" in entry["reason"] for entry in document["trace"])
