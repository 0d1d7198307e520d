"""The HTML report page's inline style sheet and script (the page fetches nothing).

The script filters rewrites and near-misses by rule, op type or node name, shows the
shallow near-misses on request, and copies a rewrite's drawing out of its <template>
when the rewrite is opened (graphopt.report.html keeps each distinct drawing once).
"""

_CSS = """
:root{--fg:#1f2328;--muted:#656d76;--line:#d0d7de;--bg2:#f6f8fa;--accent:#0969da;--before:#c7892b;--after:#3d8b56}
*{box-sizing:border-box}
body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;color:var(--fg);background:#fff}
main{max-width:1280px;margin:0 auto;padding:16px 24px 48px}
h1{font-size:22px;margin:4px 0}h2{font-size:18px;margin:28px 0 8px;padding-bottom:4px;border-bottom:1px solid var(--line)}
code{font:12px/1.3 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;word-break:break-all}
[hidden]{display:none!important}
.facts span{margin-right:18px;white-space:nowrap}.facts b{color:var(--muted);font-weight:600}
.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(190px,1fr));gap:10px}
.card{border:1px solid var(--line);border-radius:8px;padding:10px 12px;background:var(--bg2)}
.card .k{color:var(--muted);font-size:12px;text-transform:uppercase;letter-spacing:.04em}
.card .v{font-size:20px;font-weight:600;margin:2px 0}.card .d{color:var(--muted);font-size:12px;word-break:break-word}
.card[data-card=verification] .v{color:var(--after)}
.warnings{color:#9a6700}.extra{margin:6px 0;color:var(--muted)}
table{border-collapse:collapse;width:100%}th,td{text-align:left;padding:4px 8px;border-bottom:1px solid var(--line);vertical-align:top}
th{background:var(--bg2);font-weight:600;position:sticky;top:0}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.neg{color:var(--after)}.pos{color:#cf222e}.muted{color:var(--muted)}.note{color:#9a6700;background:#fff8c5;padding:6px 10px;border-radius:6px}
.doc{color:var(--muted);font-size:12px}.src code{color:var(--muted)}.opname{color:var(--muted);font-size:12px}
table.ops td.op{white-space:nowrap}table.ops td.bars{width:45%}table.ops tr.same{color:var(--muted)}
.bar{display:block;height:6px;border-radius:3px;margin:2px 0;min-width:1px}.bar.b{background:#b6bcc4}.bar.a{background:var(--accent)}
.legend .bar{display:inline-block;width:18px;margin:0 3px 0 10px}
.controls{position:sticky;top:0;z-index:2;background:#fff;padding:8px 0;display:flex;gap:8px;align-items:center;flex-wrap:wrap;border-bottom:1px solid var(--line)}
.controls input{flex:1 1 320px;padding:6px 10px;border:1px solid var(--line);border-radius:6px;font-size:14px}
.controls select,.controls button{padding:5px 8px;border:1px solid var(--line);border-radius:6px;background:var(--bg2);font-size:13px}
#shown{color:var(--muted);margin-left:auto}
details.rw{border:1px solid var(--line);border-radius:6px;margin:6px 0}
details.rw>summary{cursor:pointer;padding:6px 10px;list-style-position:inside}
details.rw[open]>summary{background:var(--bg2);border-bottom:1px solid var(--line)}
.idx{color:var(--muted);font-variant-numeric:tabular-nums}.rule{font-weight:600}.node{font-family:ui-monospace,monospace;font-size:12px}
.scope{color:var(--muted)}.delta{color:var(--muted);font-size:12px;margin-left:6px}
.rw-body{padding:8px 12px}.where{margin-bottom:8px}.matched ol{margin:4px 0;padding-left:22px;columns:2 360px}
.figs{display:grid;grid-template-columns:1fr 1fr;gap:12px}
@media (max-width:900px){.figs{grid-template-columns:1fr}}
figure.fig{margin:0;border:1px solid var(--line);border-radius:6px;padding:8px;min-width:0}
figure.before{border-top:3px solid var(--before)}figure.after{border-top:3px solid var(--after)}
figcaption{font-weight:600;margin-bottom:6px}
.svg{overflow:auto;max-height:75vh;text-align:center}.svg svg{max-width:100%;height:auto}.svg text{font-family:Helvetica,Arial,sans-serif}
ul.io{list-style:none;padding:0;margin:6px 0 0;font-size:12px}ul.io li{margin:1px 0}.ty{color:var(--muted);font-family:ui-monospace,monospace}
table.misses td.reason{font-family:ui-monospace,monospace;font-size:12px}table.misses td.hint{font-size:12px;color:#0550ae;max-width:420px}
table.misses tr.shallow{display:none}table.misses.all tr.shallow{display:table-row}
.untried{margin-top:8px;color:var(--muted)}p.gap{margin:4px 0}ol.hints{font-size:13px;color:#0550ae}ol.hints li:target{background:#fff8c5}
footer{margin-top:40px;color:var(--muted);font-size:12px}
"""

# Filtering (rewrites, rules, near-misses), lazy drawings, expand/collapse. Vanilla JS, no globals.
_JS = """
(function () {
  "use strict";
  var rewrites = Array.prototype.slice.call(document.querySelectorAll("details.rw"));
  var filtered = Array.prototype.slice.call(document.querySelectorAll("tr.rule-row, tr.miss"));
  var box = document.getElementById("filter"), pick = document.getElementById("rule-filter");
  var shown = document.getElementById("shown"), shallow = document.getElementById("shallow");
  function draw(item) {
    if (item.dataset.drawn) return;
    item.dataset.drawn = "1";
    item.querySelectorAll("[data-svg]").forEach(function (slot) {
      var template = document.getElementById(slot.dataset.svg);
      if (template) slot.appendChild(template.content.cloneNode(true));
    });
  }
  rewrites.forEach(function (item) {
    item.addEventListener("toggle", function () { if (item.open) draw(item); });
  });
  function matches(el, terms, rule) {
    if (rule && el.dataset.rule !== undefined && el.dataset.rule !== rule) return false;
    var text = el.dataset.search || "";
    for (var i = 0; i < terms.length; i++) if (text.indexOf(terms[i]) < 0) return false;
    return true;
  }
  function apply() {
    var terms = box ? box.value.toLowerCase().split(/\\s+/).filter(Boolean) : [];
    var rule = pick ? pick.value : "";
    var count = 0;
    rewrites.forEach(function (item) {
      var ok = matches(item, terms, rule);
      item.hidden = !ok;
      if (ok) count++;
    });
    filtered.forEach(function (row) { row.hidden = !matches(row, terms, rule); });
    if (shown) shown.textContent = count + " of " + rewrites.length + " rewrites";
  }
  if (box) box.addEventListener("input", apply);
  if (pick) pick.addEventListener("change", apply);
  document.querySelectorAll("a.rule-link").forEach(function (link) {
    link.addEventListener("click", function () { if (pick) { pick.value = link.dataset.rule; apply(); } });
  });
  if (shallow) shallow.addEventListener("change", function () {
    document.querySelector("table.misses").classList.toggle("all", shallow.checked);
  });
  var expand = document.getElementById("expand"), collapse = document.getElementById("collapse");
  if (expand) expand.addEventListener("click", function () {
    rewrites.forEach(function (item) { if (!item.hidden) { item.open = true; draw(item); } });
  });
  if (collapse) collapse.addEventListener("click", function () {
    rewrites.forEach(function (item) { item.open = false; });
  });
})();
"""
