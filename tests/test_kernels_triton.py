"""The Triton kernels' logic in Triton's interpreter (no GPU needed).

TRITON_INTERPRET must be set before triton is imported, and this process has imported it
already (or may), so the cases in tests/kernels_interpreter_cases.py run in one child
pytest; each kernel family here passes when all of its cases passed there.
"""

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import triton  # noqa: F401  (the test extra installs it: a missing triton fails here, never skips)

REPO = Path(__file__).resolve().parent.parent
CASES = REPO / "tests" / "kernels_interpreter_cases.py"
FAMILIES = ["triton_runs", "attention", "linear_act", "norm", "gates", "rotary"]


@pytest.fixture(scope="module")
def child_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[tuple[str, str]]]:
    """Run the cases once under the interpreter; name -> [(outcome, message)] per family."""
    report = tmp_path_factory.mktemp("interpreter") / "junit.xml"
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}", str(CASES)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )
    assert report.exists(), f"the interpreter run did not report:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    results: dict[str, list[tuple[str, str]]] = {family: [] for family in FAMILIES}
    for case in ET.parse(report).getroot().iter("testcase"):
        name = case.get("name", "")
        family = next((f for f in FAMILIES if f in name), None)
        assert family is not None, f"case {name} belongs to no family: add it to FAMILIES"
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome, message = child.tag, (child.get("message") or "") + "\n" + (child.text or "")[-3000:]
        results[family].append((f"{name}: {outcome}", message))
    return results


@pytest.mark.parametrize("family", FAMILIES)
def test_triton_kernels_in_interpreter(family: str, child_results: dict[str, list[tuple[str, str]]]) -> None:
    cases = child_results[family]
    assert cases, f"no interpreter cases ran for {family}"
    bad = [f"{name}\n{message}" for name, message in cases if not name.endswith(": passed")]
    assert not bad, "\n\n".join(bad)
