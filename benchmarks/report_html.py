"""The HTML report of a 24-layer BERT: its size, and how fast Chromium opens it.

    python benchmarks/report_html.py [--repeat 5] [--hidden 256] [--layers 24]

Builds a BertModel from transformers' BertConfig(num_hidden_layers=24) with random
weights (tests/models.py; hidden size 256 and 4 heads by default to keep the export
quick: the report's size depends on the graph's structure, not on the hidden size),
optimizes it with `graphopt optimize --target ort-cuda --report report.html` (no GPU
needed for the rewrite), then opens the page in headless Chromium (Debian's
/usr/bin/chromium, driven by Playwright) `--repeat` times, each in a fresh page, and
measures from navigation start:

* load: the load event's end;
* summary painted: when the summary's first figure was painted (Element Timing);
* page ready: the later of the two: what a user waits for.

Prints the medians and the file size, and writes them to
benchmarks/results/<date>-report_html-L<layers>-H<hidden>.json. Goals: page ready under 2 s, file under 5 MB.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))  # graphopt from this checkout

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
GOAL_SECONDS = 2.0
GOAL_BYTES = 5 * 1024 * 1024

# Run in the page after its load event: the navigation timing and the summary's paint time.
_MEASURE = """
() => new Promise(resolve => {
  const nav = performance.getEntriesByType("navigation")[0];
  const finish = painted => resolve({load_ms: nav.loadEventEnd, summary_ms: painted,
    fcp_ms: (performance.getEntriesByName("first-contentful-paint")[0] || {}).startTime || null});
  new PerformanceObserver(list => {
    const entry = list.getEntries().find(e => e.identifier === "summary");
    if (entry) finish(entry.renderTime || entry.loadTime);
  }).observe({type: "element", buffered: true});
  setTimeout(() => finish(null), 5000);
})
"""


def _measure_page(path: Path, repeat: int) -> list[dict[str, Any]]:
    from playwright.sync_api import sync_playwright

    runs = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            for attempt in range(repeat + 1):  # the first opening warms the disk cache: not counted
                page = browser.new_page(viewport={"width": 1366, "height": 800})
                fetched: list[str] = []

                def record(request: Any, fetched: list[str] = fetched) -> None:
                    if not request.url.startswith(("file://", "data:")):
                        fetched.append(request.url)

                page.on("request", record)
                page.goto(path.as_uri(), wait_until="load")
                timing = page.evaluate(_MEASURE)
                if fetched:
                    raise SystemExit(f"the page fetched {fetched}")
                if timing["summary_ms"] is None:
                    raise SystemExit("the summary's paint was not reported (no elementtiming entry)")
                timing = {key: round(value, 1) for key, value in timing.items() if value is not None}
                timing["ready_ms"] = max(timing["load_ms"], timing["summary_ms"])
                page.close()
                if attempt:
                    runs.append(timing)
        finally:
            browser.close()
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--keep", type=Path, help="Also copy the page here.")
    args = parser.parse_args()

    import models  # tests/models.py: cached builders

    model = models.bert(layers=args.layers, hidden=args.hidden, heads=args.heads, seq=128, exporter="dynamo")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    with tempfile.TemporaryDirectory() as folder:
        page = Path(folder) / "report.html"
        command = [sys.executable, "-m", "graphopt", "optimize", str(model), "-o", str(Path(folder) / "out.onnx"), "--target", "ort-cuda"]
        t0 = time.perf_counter()
        subprocess.run([*command, "--report", str(page), "-q"], check=True, env=env)
        with_html = time.perf_counter() - t0
        size = page.stat().st_size
        text = page.read_text()
        rewrites, drawings = text.count('<details class="rw"'), text.count("<template ")
        runs = _measure_page(page, args.repeat)
        if args.keep:
            args.keep.write_text(text)

    median = {key: statistics.median(run[key] for run in runs) for key in ("load_ms", "summary_ms", "ready_ms")}
    print(f"model: BERT {args.layers} layers, hidden {args.hidden}, {args.heads} heads ({model.parent.name})")
    print(f"report: {size / 1e6:.2f} MB, {rewrites} rewrites, {drawings} distinct drawings; optimize + report {with_html:.1f} s")
    print(
        f"Chromium, median of {len(runs)}: load {median['load_ms']:.0f} ms, summary painted {median['summary_ms']:.0f} ms, "
        f"page ready {median['ready_ms']:.0f} ms"
    )
    ok = median["ready_ms"] / 1000 < GOAL_SECONDS and size < GOAL_BYTES
    print(f"goal (< {GOAL_SECONDS:.0f} s, < {GOAL_BYTES // 2**20} MB): {'met' if ok else 'NOT met'}")

    date = datetime.date.today().isoformat()
    out = ROOT / "benchmarks" / "results" / f"{date}-report_html-L{args.layers}-H{args.hidden}.json"
    record = {
        "date": date,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}",
        "command": "python benchmarks/report_html.py " + " ".join(sys.argv[1:]),
        "model": {"layers": args.layers, "hidden": args.hidden, "heads": args.heads, "path": model.parent.name},
        "bytes": size,
        "rewrites": rewrites,
        "drawings": drawings,
        "optimize_and_report_s": round(with_html, 3),
        "runs": runs,
        "median": median,
        "goal_met": ok,
    }
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {out.relative_to(ROOT)}")
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
