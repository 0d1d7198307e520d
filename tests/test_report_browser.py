"""The HTML report in a real headless browser: Debian's Chromium driven by Playwright.

The page must load with no console error and no network request, draw its SVGs
with a real size, and filter its rewrites as the user types. A screenshot is kept
in tests/artifacts/. It needs Chromium and Playwright: on a machine without them it
is skipped, saying so; CI installs them and sets GRAPHOPT_REQUIRE_BROWSER=1 (.ci/run),
which turns that skip into a failure, so CI cannot pass without the browser test.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import models  # tests/models.py: the cached model zoo
import pytest

from graphopt.api import optimize
from graphopt.report.html import write_html
from graphopt.report.render import report_to_json

#: Set by CI: a missing browser is then a failure, not a skip.
REQUIRE_BROWSER = "GRAPHOPT_REQUIRE_BROWSER"
# No sandbox (CI containers run as root), nothing in the background that could reach the network.
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
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None


def _missing(why: str) -> None:
    """Skip, saying why, unless CI asked for the browser test (then fail)."""
    if os.environ.get(REQUIRE_BROWSER, "") not in ("", "0"):
        pytest.fail(f"{why}, and {REQUIRE_BROWSER} is set: the browser test must run", pytrace=False)
    pytest.skip(f"{why} (CI installs it and sets {REQUIRE_BROWSER}=1: see .ci/run)")


def _playwright() -> tuple[Any, Any, str]:
    """(sync_playwright, expect, Chromium's path), or a skip (a failure under CI) when missing."""
    try:
        from playwright.sync_api import expect, sync_playwright
    except ImportError as error:
        _missing(f"playwright is not installed ({error})")
    chromium = _chromium()
    if chromium is None:
        _missing("no Chromium browser found (apt-get install chromium)")
    assert chromium is not None
    return sync_playwright, expect, chromium


def _searchable(record: dict[str, Any]) -> str:
    """What the page's filter searches in a rewrite, per the report's documentation."""
    nodes = (record.get("before") or {}).get("nodes") or []
    parts = [record["rule"], record["node"], record["scope"], record["op"], *record["added"]]
    parts += [f"{n['name']} {n['op']}" for n in nodes]
    return " ".join(parts).lower()


def test_report_in_chromium(tmp_path: Path) -> None:
    sync_playwright, expect, chromium = _playwright()
    _, report = optimize(models.ZOO["bert-tiny-dynamo"](), target="ort-cuda")
    document = json.loads(report_to_json(report))
    page_path = tmp_path / "report.html"
    write_html(document, page_path)
    records = [rw for rule in document["rules"] for rw in rule["rewrites"]]
    assert len(records) == document["total_rewrites"] > 10

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1366, "height": 800})
            errors: list[str] = []
            fetched: list[str] = []
            page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.on("request", lambda request: None if request.url.startswith(("file://", "data:")) else fetched.append(request.url))
            page.goto(page_path.as_uri(), wait_until="load")

            rows = page.locator("details.rw")
            assert rows.count() == len(records)
            assert page.locator("details.rw:visible").count() == len(records)
            assert page.locator("#summary .card").first.is_visible()

            # Drawings are copied in when a rewrite is opened (the toggle event comes a moment
            # after the click: expect() waits for it); every one gets a real size.
            assert page.locator("details.rw svg").count() == 0
            rows.first.locator("summary").click()
            expect(rows.first.locator("svg")).to_have_count(2)
            page.click("#expand")
            expect(page.locator("details.rw svg")).to_have_count(2 * len(records))
            boxes = page.evaluate(
                "Array.from(document.querySelectorAll('details.rw svg')).map(s => {"
                " const r = s.getBoundingClientRect(); return [r.width, r.height]; })"
            )
            assert len(boxes) == 2 * len(records)
            assert all(w > 0 and h > 0 for w, h in boxes), boxes
            page.click("#collapse")

            # Filter by op type: the rewrites that inserted or matched a MultiHeadAttention.
            page.fill("#filter", "MultiHeadAttention")
            want = sum(1 for r in records if "multiheadattention" in _searchable(r))
            assert 0 < want < len(records)
            expect(page.locator("details.rw:visible")).to_have_count(want)
            expect(page.locator("#shown")).to_have_text(f"{want} of {len(records)} rewrites")
            # By node name, with two words (both must match).
            node = next(r for r in records if r["rule"] == "FuseAttention")["node"]
            page.fill("#filter", f"{node} fuseattention")
            want = sum(1 for r in records if node.lower() in _searchable(r) and "fuseattention" in _searchable(r))
            assert want >= 1
            expect(page.locator("details.rw:visible")).to_have_count(want)
            # By rule, from the list: exactly that rule's applications.
            page.fill("#filter", "")
            rule = max(document["rules"], key=lambda r: r["applications"])
            page.select_option("#rule-filter", rule["name"])
            expect(page.locator("details.rw:visible")).to_have_count(rule["applications"])
            assert set(page.locator("details.rw:visible").evaluate_all("rows => rows.map(r => r.dataset.rule)")) == {rule["name"]}
            # The near-misses follow the same filter.
            misses = page.locator("tr.miss:not([hidden])")
            assert set(misses.evaluate_all("rows => rows.map(r => r.dataset.rule)")) <= {rule["name"]}
            page.select_option("#rule-filter", "")
            expect(page.locator("details.rw:visible")).to_have_count(len(records))
            # Misses at the first op show when asked.
            shallow = page.locator("tr.miss.shallow")
            assert shallow.count() > 0
            expect(shallow.first).to_be_hidden()
            page.check("#shallow")
            expect(shallow.first).to_be_visible()

            # A picture of the page with one rewrite open, for people to look at.
            page.locator("details.rw").nth(5).locator("summary").click()
            expect(page.locator("details.rw").nth(5).locator("svg")).to_have_count(2)
            page.locator("details.rw").nth(5).scroll_into_view_if_needed()
            ARTIFACTS.mkdir(exist_ok=True)
            shot = ARTIFACTS / "report_browser.png"
            page.screenshot(path=str(shot), full_page=False)
            assert shot.stat().st_size > 10_000

            assert errors == [], errors
            assert fetched == [], fetched
        finally:
            browser.close()


def test_missing_browser_is_a_failure_when_ci_requires_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # Without the variable: a skip that says why. With it (CI): a failure.
    monkeypatch.delenv(REQUIRE_BROWSER, raising=False)
    with pytest.raises(pytest.skip.Exception, match="no Chromium"):
        _missing("no Chromium browser found")
    monkeypatch.setenv(REQUIRE_BROWSER, "1")
    with pytest.raises(pytest.fail.Exception, match="must run"):
        _missing("no Chromium browser found")
