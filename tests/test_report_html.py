"""The HTML report (graphopt/report/html.py), checked from the page itself.

A tiny BERT and a tiny ResNet are optimized, their reports rendered, and the page
parsed with html.parser: one entry per rewrite with a drawing before and after,
the rules and their counts, the near-misses with their reasons and hints, no
external URL. The CLI's `--report x.html` and `graphopt report` are checked too,
with bad input.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import models  # tests/models.py: the cached model zoo
import pytest
from conftest import run_cli
from rule_testing import FUSED_CONV_WINS
from test_report import validate

from graphopt.api import optimize
from graphopt.library import display_source
from graphopt.report.hints import hint_for, target_gap
from graphopt.report.html import render_html, write_html
from graphopt.report.model import MAX_LOCATIONS
from graphopt.report.render import report_to_json

# ------------------------------------------------------------------ a small DOM


@dataclass
class Element:
    tag: str
    attrs: dict[str, str]
    content: list[Element | str] = field(default_factory=list)  # child elements and text, in order

    @property
    def children(self) -> list[Element]:
        return [c for c in self.content if isinstance(c, Element)]

    @property
    def classes(self) -> set[str]:
        return set(self.attrs.get("class", "").split())

    def iter(self) -> Any:
        yield self
        for child in self.children:
            yield from child.iter()

    def find_all(self, tag: str | None = None, cls: str | None = None) -> list[Element]:
        return [e for e in self.iter() if (tag is None or e.tag == tag) and (cls is None or cls in e.classes)]

    def text(self) -> str:
        return "".join(c if isinstance(c, str) else c.text() for c in self.content)


class _TreeBuilder(HTMLParser):
    VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Element("#root", {})
        self.stack = [self.root]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        element = Element(tag, {k: v or "" for k, v in attrs})
        self.stack[-1].content.append(element)
        if tag not in self.VOID:
            self.stack.append(element)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.stack[-1].content.append(Element(tag, {k: v or "" for k, v in attrs}))

    def handle_endtag(self, tag: str) -> None:
        for i in range(len(self.stack) - 1, 0, -1):
            if self.stack[i].tag == tag:
                del self.stack[i:]
                return

    def handle_data(self, data: str) -> None:
        self.stack[-1].content.append(data)


def parse(page: str) -> Element:
    builder = _TreeBuilder()
    builder.feed(page)
    builder.close()
    return builder.root


# ------------------------------------------------------------------ fixtures


@dataclass
class Rendered:
    document: dict[str, Any]
    page: str
    dom: Element


def _render(model: Path, target: str, **options: Any) -> Rendered:
    _, report = optimize(model, target=target, **options)
    report.input_path = str(model)
    document = json.loads(report_to_json(report))
    page = render_html(document)
    return Rendered(document, page, parse(page))


@pytest.fixture(scope="module")
def bert() -> Rendered:
    return _render(models.ZOO["bert-tiny-dynamo"](), "ort-cuda")


@pytest.fixture(scope="module")
def resnet() -> Rendered:
    # FusedConv predicted faster, so that the model keeps the fused op the rendering is checked with.
    return _render(models.ZOO["resnet-tiny-dynamo-noopt"](), "ort-cpu", cost_table=FUSED_CONV_WINS)


def _templates(dom: Element) -> dict[str, Element]:
    return {t.attrs["id"]: t for t in dom.find_all("template")}


# ------------------------------------------------------------------ content


def test_snapshots_fit_the_schema(bert: Rendered, resnet: Rendered) -> None:
    for rendered in (bert, resnet):
        validate(rendered.document)
        records = [rw for r in rendered.document["rules"] for rw in r["rewrites"]]
        assert all(rw["before"]["nodes"] and rw["matched"] == [n["name"] for n in rw["before"]["nodes"]] for rw in records)
        # The replacement's nodes are the ones the record says were added.
        assert all([n["op"] for n in rw["after"]["nodes"]] == rw["added"] for rw in records)


@pytest.mark.parametrize("name", ["bert", "resnet"])
def test_one_entry_per_rewrite_with_counts_per_rule(name: str, request: pytest.FixtureRequest) -> None:
    rendered: Rendered = request.getfixturevalue(name)
    document, dom = rendered.document, rendered.dom
    entries = dom.find_all("details", "rw")
    assert document["total_rewrites"] > 10
    assert len(entries) == document["total_rewrites"]
    per_rule = Counter(e.attrs["data-rule"] for e in entries)
    applied = {r["name"]: r["applications"] for r in document["rules"] if r["applications"]}
    assert per_rule == applied
    # The rules table: every rule that was tried, with its counts and source location.
    rows = {row.attrs["data-rule"]: row for row in dom.find_all("tr", "rule-row")}
    for rule in document["rules"]:
        if rule["attempts"]:
            cells = [c.text().strip() for c in rows[rule["name"]].find_all("td")]
            assert cells[1:4] == [str(rule["applications"]), str(rule["matches"]), str(rule["attempts"])]
            # Built-in rules are shown relative to the library, never as absolute (site-packages) paths.
            assert rule["source"] and cells[5] == display_source(rule["source"])
            assert cells[5].startswith("rules/") and not os.path.isabs(cells[5])
    # The summary shows the node counts before and after.
    nodes = next(c for c in dom.find_all("div", "card") if c.attrs.get("data-card") == "nodes")
    assert f"{document['before']['nodes']:,} → {document['after']['nodes']:,}" in nodes.text()


@pytest.mark.parametrize("name", ["bert", "resnet"])
def test_every_rewrite_has_a_drawing_before_and_after(name: str, request: pytest.FixtureRequest) -> None:
    rendered: Rendered = request.getfixturevalue(name)
    templates = _templates(rendered.dom)
    by_index = {rw["index"]: rw for r in rendered.document["rules"] for rw in r["rewrites"]}
    entries = rendered.dom.find_all("details", "rw")
    for entry in entries:
        index = int(entry.find_all("span", "idx")[0].text().lstrip("#"))
        record = by_index[index]
        slots = [e for e in entry.iter() if "data-svg" in e.attrs]
        assert len(slots) == 2, f"rewrite #{index} has {len(slots)} drawings"
        before, after = (templates[slot.attrs["data-svg"]] for slot in slots)
        for template, snapshot in ((before, record["before"]), (after, record["after"])):
            assert template.find_all("svg"), "the template holds an SVG drawing"
            labels = [t.text() for t in template.find_all("text")]
            # The snapshot's ops and its boundary nodes are drawn.
            assert Counter(n["op"] for n in snapshot["nodes"]) <= Counter(labels)
            assert sum(1 for label in labels if re.fullmatch(r"(in|const) \d+", label)) == len(snapshot["inputs"])
        assert record["before"]["nodes"][0]["op"].split(".")[-1] == record["op"]  # the root comes first (record.op has no domain)
        # The matched node names are listed beside the drawing.
        listed = [c.text() for c in entry.find_all("div", "matched")[0].find_all("code")]
        assert listed == [n["name"] for n in record["before"]["nodes"]]
    # Identical rewrites share one drawing: far fewer drawings than rewrites.
    assert len(templates) < len(entries)


def test_edges_carry_dtypes_and_shapes(resnet: Rendered) -> None:
    fold = next(r for r in resnet.document["rules"] if r["name"] == "FoldConvBatchNorm")
    record = fold["rewrites"][0]
    entry = next(e for e in resnet.dom.find_all("details", "rw") if e.find_all("span", "idx")[0].text() == f"#{record['index']}")
    before = _templates(resnet.dom)[next(e for e in entry.iter() if "data-svg" in e.attrs).attrs["data-svg"]]
    labels = {t.text() for t in before.find_all("text")}
    conv_input = next(e for e in record["before"]["edges"] if e["dst"] == "n1" and e["src"].startswith("i"))
    assert conv_input["dtype"] == "f32" and conv_input["shape"]
    assert f"f32[{','.join(str(d) for d in conv_input['shape'])}]" in labels


def _open_misses(document: dict[str, Any]) -> tuple[list[tuple[str, dict[str, Any]]], list[tuple[str, dict[str, Any]]]]:
    """(open, resolved) near-misses: resolved ones are at a node where the rule applied later."""
    applied_at = {(rw["rule"], rw["scope"], rw["matched"][0]) for r in document["rules"] for rw in r["rewrites"]}
    misses = [(r["name"], m) for r in document["rules"] for m in r["near_misses"]]
    resolved = [(rule, m) for rule, m in misses if (rule, m["scope"], m["node"]) in applied_at]
    return [x for x in misses if x not in resolved], resolved


def test_near_misses_with_reasons_and_hints(resnet: Rendered, bert: Rendered) -> None:
    for rendered in (resnet, bert):
        rows = rendered.dom.find_all("tr", "miss")
        texts = [row.text() for row in rows]
        expected, _ = _open_misses(rendered.document)
        expected = [(rule, m) for rule, m in expected if not target_gap(m["reason"])]
        assert len(rows) == len(expected) > 0
        for rule, miss in expected:
            assert any(rule in text and miss["node"] in text and miss["reason"] in text for text in texts), (rule, miss)
        # Each row points to the hint the hint table gives for its reason; each hint is written once.
        listed = {li.attrs["id"]: li.text() for li in rendered.dom.find_all("li") if li.attrs.get("id", "").startswith("hint-")}
        assert len(set(listed.values())) == len(listed) > 0
        for row in rows:
            reason = row.find_all("td", "reason")[0].text()
            links = row.find_all("td", "hint")[0].find_all("a")
            expected_hint = hint_for(reason)
            assert (listed[links[0].attrs["href"][1:]] if links else None) == (expected_hint.replace("`", "") if expected_hint else None)
        assert rendered.page.count("another --target (onnx, ort-cpu, ort-cuda) may take") <= 1
    # The BERT's embedding LayerNorm has a Min(512, seq) dim: the hint says how to fix the dims.
    skip = [row for row in bert.dom.find_all("tr", "miss") if row.attrs["data-rule"] == "FuseSkipLayerNorm"]
    assert any("Min(512, seq)" in row.text() for row in skip)
    assert "make_dynamic_shape_fixed" in bert.dom.text()


def test_near_misses_resolved_later_are_left_out(resnet: Rendered) -> None:
    # The ResNet's Conv biases are computed (Expand of a zero): FoldConvBatchNorm fails on
    # 'b' in the first sweep, constant folding folds them, and it applies in the second.
    _, resolved = _open_misses(resnet.document)
    assert any(rule == "FoldConvBatchNorm" and "'b' is not a constant" in m["reason"] for rule, m in resolved)
    shown = {(row.attrs["data-rule"], row.find_all("code")[0].text()) for row in resnet.dom.find_all("tr", "miss")}
    assert not shown & {(rule, m["node"]) for rule, m in resolved}
    # A miss at a node another rule took later says so: FoldConvBatchNormComputedWeights
    # failed where FoldConvBatchNorm applied after the bias was folded.
    taken = {rw["matched"][0]: rw for r in resnet.document["rules"] for rw in r["rewrites"] if r["name"] == "FoldConvBatchNorm"}
    computed = [row for row in resnet.dom.find_all("tr", "miss") if row.attrs["data-rule"] == "FoldConvBatchNormComputedWeights"]
    assert computed
    for row in computed:
        record = taken[row.find_all("code")[0].text()]
        assert f"later rewritten by FoldConvBatchNorm (#{record['index']})" in row.text()
    section = next(s for s in resnet.dom.find_all("section") if s.attrs.get("id") == "near-misses")
    assert f"{len(resolved)} misses at nodes where the rule applied in a later sweep are left out." in section.text()


@pytest.mark.parametrize(
    "reason, words",
    [
        ("AttentionDims: the number of heads or the head size is not static (q [batch, 2, seq, 32])", "num_heads could not be inferred"),
        ("SameStaticShape: the shapes are not known to be equal: [batch, seq, 64] vs [1, Min(512, seq), 64]", "make_dynamic_shape_fixed"),
        ("ShapeIsStatic: dims ['batch'] are not static", "make_dynamic_shape_fixed"),
        ("'b' is not a constant", "constant folding"),
        ("interior node n1 has another user, n2", "used outside the pattern"),
        ("target ort-cpu has no graphopt.FusedConv kernel for f16", "--target"),
        ("expected Add, got graphopt.SkipLayerNorm", "already fused"),
        ("attribute approximate = 'none', pattern wants 'tanh'", "attribute"),
        ("the model's opset is 11; the standard op needs 17", "version_converter"),
        ("expected Mul, got Add", None),
    ],
)
def test_hints(reason: str, words: str | None) -> None:
    hint = hint_for(reason)
    assert (hint is None) if words is None else (hint is not None and words in hint)


def test_self_contained(bert: Rendered, resnet: Rendered) -> None:
    for rendered in (bert, resnet):
        for element in rendered.dom.iter():
            for attr in ("src", "href", "xlink:href", "action", "poster", "data"):
                value = element.attrs.get(attr)
                assert value is None or value.startswith("#"), f"<{element.tag} {attr}={value!r}>"
            assert element.tag not in ("link", "iframe", "object", "embed", "img")
        assert not re.search(r"https?://|url\(|@import", rendered.page)
        assert len(rendered.dom.find_all("script")) == 1 and len(rendered.dom.find_all("style")) == 1


def test_names_from_the_model_are_escaped(bert: Rendered) -> None:
    document = json.loads(json.dumps(bert.document))
    evil = '<script>alert("x")</script><img src=x onerror=alert(1)>'
    rule = next(r for r in document["rules"] if r["rewrites"])
    rule["rewrites"][0]["node"] = evil
    rule["rewrites"][0]["before"]["nodes"][0]["name"] = evil
    rule["rewrites"][0]["before"]["nodes"][0]["op"] = 'Op"/><script>x</script'  # SVG text is escaped
    document["warnings"] = [evil]
    page = render_html(document)
    assert evil not in page and "<img" not in page
    assert page.count("<script>") == 1
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page
    drawings = [t.text() for t in parse(page).find_all("text")]
    assert 'Op"/><script>x</script' in drawings


def test_drawings_need_no_system_tool(bert: Rendered, monkeypatch: pytest.MonkeyPatch) -> None:
    # Graphviz's `dot` (or any other program) is never run: with an empty PATH the page has its drawings.
    import subprocess

    monkeypatch.setenv("PATH", "")
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("a program was run"))
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: pytest.fail("a program was run"))
    dom = parse(render_html(bert.document))
    assert len(dom.find_all("details", "rw")) == bert.document["total_rewrites"]
    templates = dom.find_all("template")
    assert templates and all(t.find_all("svg") and t.find_all("rect") and t.find_all("polyline") for t in templates)
    assert not dom.find_all("p", "note")


def test_drawings_can_be_turned_off(bert: Rendered) -> None:
    dom = parse(render_html(bert.document, drawings=False))
    assert len(dom.find_all("details", "rw")) == bert.document["total_rewrites"]
    assert not dom.find_all("svg") and not dom.find_all("template")


def test_drawing_layout_is_layered() -> None:
    # A chain in -> A -> B -> out is drawn top to bottom, each box below the one feeding it,
    # with one arrow per edge and the edge's type as its label, on the edge between the two.
    from graphopt.report.drawing import snapshot_to_svg

    snapshot = {
        "nodes": [{"op": "Conv"}, {"op": "Relu"}],
        "inputs": [{"name": "x", "dtype": "f32", "shape": [1, 3]}],
        "outputs": [{"name": "y"}],
        "edges": [
            {"src": "i0", "dst": "n0", "dtype": "f32", "shape": [1, 3]},
            {"src": "n0", "dst": "n1", "dtype": "f32", "shape": [1, 3]},
            {"src": "n1", "dst": "o0", "dtype": "f32", "shape": [1, 3]},
        ],
    }
    svg = parse(snapshot_to_svg(snapshot, "after"))
    boxes = {t.text(): float(t.attrs["y"]) for t in svg.find_all("text") if t.attrs.get("text-anchor") == "middle"}
    assert boxes["in 0"] < boxes["Conv"] < boxes["Relu"] < boxes["out 0"]
    assert len(svg.find_all("polygon")) == 3  # arrowheads
    assert len(svg.find_all("polyline")) == 6  # each edge in two pieces, its label between them
    texts = [(t.text(), float(t.attrs["y"])) for t in svg.find_all("text")]
    types = sorted(y for text, y in texts if text == "f32[1,3]")
    assert len(types) == 3
    assert boxes["in 0"] < types[0] < boxes["Conv"] < types[1] < boxes["Relu"] < types[2] < boxes["out 0"]
    assert snapshot_to_svg(snapshot, "after") == snapshot_to_svg(snapshot, "after")  # deterministic: identical rewrites share one drawing


def test_older_report_without_snapshots(bert: Rendered) -> None:
    document = json.loads(json.dumps(bert.document))
    for rule in document["rules"]:
        for record in rule["rewrites"]:
            for key in ("before", "after", "matched"):
                record.pop(key)
    for key in ("latency",):
        document.pop(key, None)
    dom = parse(render_html(document))
    entries = dom.find_all("details", "rw")
    assert len(entries) == document["total_rewrites"]
    assert all("no snapshot recorded" in e.text() for e in entries)


def test_entries_per_rule_are_capped(bert: Rendered) -> None:
    document = json.loads(json.dumps(bert.document))
    rule = next(r for r in document["rules"] if r["rewrites"])
    first = rule["rewrites"][0]
    extra = MAX_LOCATIONS + 5 - len(rule["rewrites"])
    rule["rewrites"] += [dict(first, index=10_000 + k, node=f"copy_{k}") for k in range(extra)]
    rule["applications"] += extra
    document["total_rewrites"] += extra
    dom = parse(render_html(document, drawings=False))
    shown = [e for e in dom.find_all("details", "rw") if e.attrs["data-rule"] == rule["name"]]
    assert len(shown) == MAX_LOCATIONS
    assert "5 more rewrites applied but not listed." in dom.text()


def test_latency_is_shown_when_known(resnet: Rendered) -> None:
    document = dict(resnet.document, latency={"before_ms": 4.0, "after_ms": 2.5, "provider": "CUDAExecutionProvider", "runs": 20})
    card = next(c for c in parse(render_html(document)).find_all("div", "card") if c.attrs.get("data-card") == "latency")
    assert "4.00 ms → 2.50 ms" in card.text() and "1.60× faster" in card.text()
    unknown = next(c for c in resnet.dom.find_all("div", "card") if c.attrs.get("data-card") == "latency")
    assert "not measured" in unknown.text()


def test_parameters_before_and_after(resnet: Rendered) -> None:
    before, after = resnet.document["before"], resnet.document["after"]
    # Folding BatchNormalization into Conv drops its four vectors per Conv.
    assert before["parameters"] > after["parameters"] > 0
    assert before["initializers"] > after["initializers"]


# ------------------------------------------------------------------ the command line


def test_cli_writes_html_or_json_by_suffix(tmp_path: Path) -> None:
    model = models.ZOO["bert-tiny-dynamo"]()
    page, data = tmp_path / "r.html", tmp_path / "r.json"
    done = run_cli("optimize", model, "-o", tmp_path / "o.onnx", "--target", "ort-cuda", "--report", page, "-q")
    assert done.returncode == 0, done.stderr
    assert page.read_text().startswith("<!DOCTYPE html>")
    done = run_cli("optimize", model, "-o", tmp_path / "o.onnx", "--target", "ort-cuda", "--report", data, "-q")
    assert done.returncode == 0, done.stderr
    document = json.loads(data.read_text())
    done = run_cli("report", data, "-o", tmp_path / "again.html")
    assert done.returncode == 0, done.stderr
    dom = parse((tmp_path / "again.html").read_text())
    assert len(dom.find_all("details", "rw")) == document["total_rewrites"]
    # Nothing half-written left behind.
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".") or p.name.endswith(".tmp")]


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "No such file"),
        ("", "empty"),
        ("{not json", "not valid JSON"),
        ("[1, 2]", "not a graphopt report"),
        ('{"schema": "graphopt.report", "version": 99}', "newer than this graphopt reads"),
        ('{"schema": "graphopt.report", "version": 1, "rules": {}}', '"rules" is not a list'),
    ],
)
def test_report_command_bad_input(tmp_path: Path, content: str | None, message: str) -> None:
    source = tmp_path / "r.json"
    if content is not None:
        source.write_text(content)
    done = run_cli("report", source, "-o", tmp_path / "r.html")
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], done.stderr
    assert not (tmp_path / "r.html").exists()


def test_write_html_is_atomic_and_keeps_the_old_page_on_failure(tmp_path: Path, bert: Rendered) -> None:
    target = tmp_path / "r.html"
    target.write_text("old page")
    with pytest.raises(Exception, match="not a graphopt report"):
        write_html({"schema": "something else"}, target)
    assert target.read_text() == "old page"
    write_html(bert.document, target)
    assert target.read_text().startswith("<!DOCTYPE html>")
    assert [p.name for p in tmp_path.iterdir()] == ["r.html"]


def test_headings_name_the_ops_the_model_has(resnet: Rendered) -> None:
    # A rewrite inserts graphopt.FusedConv; the model (and the op table) has com.microsoft.FusedConv
    # on ort-cpu: the heading says what the model has, the drawing's caption says both.
    fused = [e for e in resnet.dom.find_all("details", "rw") if e.attrs["data-rule"] == "FuseConvActivation"]
    assert fused
    for entry in fused:
        summary = entry.find_all("span", "delta")[0].text()
        assert "com.microsoft.FusedConv" in summary and "graphopt.FusedConv" not in summary
        assert "graphopt.FusedConv is lowered to com.microsoft.FusedConv for ort-cpu" in entry.text()
    ops = [c.text() for c in resnet.dom.find_all("td", "op")]
    assert "com.microsoft.FusedConv" in ops and "graphopt.FusedConv" not in ops


def test_target_gaps_are_one_line_not_rows(tmp_path: Path) -> None:
    # On target onnx (no FusedConv), every Conv+Relu site fails the same way: one line, no row.
    model = models.ZOO["resnet-tiny-dynamo-noopt"]()
    rendered = _render(model, "onnx")
    gap_rows = [row for row in rendered.dom.find_all("tr", "miss") if "has no lowering" in row.text()]
    assert gap_rows == []
    lines = [p.text() for p in rendered.dom.find_all("p", "gap")]
    assert len(lines) == 1 and "target onnx has no lowering for graphopt.FusedConv" in lines[0] and "FuseConvActivation ×" in lines[0]
