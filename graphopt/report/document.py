"""Reading a JSON rewrite report back: `load_report_document` and the checks rendering relies on.

`graphopt report report.json -o report.html` renders a report written earlier by
`graphopt optimize --report FILE.json` (docs/report-schema.md). Before anything is drawn
the document is checked: a graphopt report of a version this graphopt reads, with its
lists and objects where they belong; anything else is one GraphoptError line.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from graphopt.errors import GraphoptError
from graphopt.report.model import SCHEMA_NAME, SCHEMA_VERSION

__all__ = ["load_report_document", "check_document"]



def load_report_document(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a JSON report written by `graphopt optimize --report FILE.json`.

    Raises GraphoptError (one line) when the file is not JSON or not a graphopt report;
    OSError when it cannot be read."""
    path = Path(path)
    if path.is_dir():
        raise GraphoptError(f"{path}: is a directory, not a JSON report")
    text = path.read_text(encoding="utf-8", errors="replace")
    if not text.strip():
        raise GraphoptError(f"{path}: the file is empty, not a JSON report")
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise GraphoptError(f"{path}: not valid JSON: {error.msg} (line {error.lineno}, column {error.colno})") from None
    check_document(document, str(path))
    return document


def check_document(document: Any, where: str = "report") -> None:
    """The checks rendering relies on: a graphopt report of a version this graphopt reads,
    with its lists and objects where they belong. Other fields may be missing or extra."""
    if not isinstance(document, dict) or document.get("schema") != SCHEMA_NAME:
        raise GraphoptError(f"{where}: not a graphopt report (no \"schema\": \"{SCHEMA_NAME}\" at the top)")
    version = document.get("version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise GraphoptError(f"{where}: the report has no integer \"version\"")
    if version > SCHEMA_VERSION:
        raise GraphoptError(f"{where}: report version {version} is newer than this graphopt reads ({SCHEMA_VERSION}); upgrade graphopt")
    for key in ("before", "after", "verification", "latency", "times_s"):
        if document.get(key) is not None and not isinstance(document[key], dict):
            raise GraphoptError(f"{where}: \"{key}\" is not an object")
    for key in ("rules", "passes", "warnings"):
        if document.get(key) is not None and not isinstance(document[key], list):
            raise GraphoptError(f"{where}: \"{key}\" is not a list")
    for i, rule in enumerate(document.get("rules") or []):
        if not isinstance(rule, dict) or not isinstance(rule.get("name"), str):
            raise GraphoptError(f"{where}: rules[{i}] is not a rule (an object with a \"name\")")
        for key in ("rewrites", "near_misses"):
            items = rule.get(key)
            if items is not None and (not isinstance(items, list) or not all(isinstance(item, dict) for item in items)):
                raise GraphoptError(f"{where}: rules[{i}].{key} is not a list of objects")
