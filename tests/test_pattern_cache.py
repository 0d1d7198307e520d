"""The on-disk cache of parsed .pdll files (graphopt/pattern/pdll.py): read back only for
the same file bytes, path and front end; never a stale parse."""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import pytest

from graphopt.pattern import pdll
from graphopt.pattern.loader import load_patterns

RULE = """\
/// Relu of Relu -> one Relu
Pattern {name} {{
  let inner = op<Relu>(x);
  let outer = op<Relu>(inner);
  replace outer with inner;
}}
"""


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(root))
    monkeypatch.delenv("GRAPHOPT_NO_CACHE", raising=False)
    return root / "graphopt" / "patterns"


def _pickles(cache: Path) -> list[Path]:
    return sorted(cache.glob("*.pickle")) if cache.exists() else []


def _forbid_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(text: str, path: str = "<string>") -> None:
        raise AssertionError("parsed although the cache holds this file")

    monkeypatch.setattr(pdll, "parse_pdll", refuse)


def test_a_parsed_file_is_read_back_from_the_cache(tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = tmp_path / "rules.pdll"
    source.write_text(RULE.format(name="CollapseRelus"))
    first = pdll.parse_pdll_file(source)
    assert len(_pickles(cache)) == 1
    _forbid_parsing(monkeypatch)
    again = pdll.parse_pdll_file(source)
    assert again == first
    assert [r.name for r in again.rules] == ["CollapseRelus"]
    # Each rule's benefit and `first` choice come computed with it (the driver's set-up need not walk the rule again).
    assert again.rules[0].__dict__.get("effective_benefit") == 2
    assert "first_choice" in again.rules[0].__dict__ and again.rules[0].first_choice is None


def test_an_edited_pattern_file_is_parsed_again(tmp_path: Path, cache: Path) -> None:
    folder = tmp_path / "patterns"
    folder.mkdir()
    source = folder / "rules.pdll"
    source.write_text(RULE.format(name="CollapseRelus"))
    assert [r.name for r in load_patterns(folder)] == ["CollapseRelus"]
    source.write_text(RULE.format(name="MergeRelus"))  # same length, same folder: only the bytes differ
    assert [r.name for r in load_patterns(folder)] == ["MergeRelus"]
    assert len(_pickles(cache)) == 2
    source.write_text(RULE.format(name="CollapseRelus"))  # back as it was: that parse is still good
    assert [r.name for r in load_patterns(folder)] == ["CollapseRelus"]
    assert len(_pickles(cache)) == 2


def test_the_same_text_at_another_path_is_parsed_for_that_path(tmp_path: Path, cache: Path) -> None:
    # Locations name the file: a copy must not report the original's path.
    a, b = tmp_path / "a.pdll", tmp_path / "b.pdll"
    a.write_text(RULE.format(name="CollapseRelus"))
    shutil.copy(a, b)
    pdll.parse_pdll_file(a)
    parsed = pdll.parse_pdll_file(b)
    assert parsed.rules[0].loc is not None and parsed.rules[0].loc.file == str(b)
    assert len(_pickles(cache)) == 2


def test_an_edit_to_the_front_end_is_a_new_key(tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The pickles hold the IR's classes as the front end built them: a changed grammar,
    # builder or IR module must not read parses made by the old one.
    source = tmp_path / "rules.pdll"
    source.write_text(RULE.format(name="CollapseRelus"))
    front_end = tmp_path / "front_end"
    front_end.mkdir()
    for name in pdll._FRONT_END_FILES:
        shutil.copy(Path(pdll.__file__).with_name(name), front_end / name)
    monkeypatch.setattr(pdll, "__file__", str(front_end / "pdll.py"))
    pdll._front_end_digest.cache_clear()
    try:
        before = pdll._cache_path(source.read_bytes(), source)
        for name in pdll._FRONT_END_FILES:
            pdll._front_end_digest.cache_clear()
            original = (front_end / name).read_bytes()
            (front_end / name).write_bytes(original + b"\n")
            assert pdll._cache_path(source.read_bytes(), source) != before, name
            (front_end / name).write_bytes(original)
        pdll._front_end_digest.cache_clear()
        assert pdll._cache_path(source.read_bytes(), source) == before
    finally:
        pdll._front_end_digest.cache_clear()


def test_a_damaged_cache_file_is_parsed_over(tmp_path: Path, cache: Path) -> None:
    source = tmp_path / "rules.pdll"
    source.write_text(RULE.format(name="CollapseRelus"))
    first = pdll.parse_pdll_file(source)
    (cached,) = _pickles(cache)
    cached.write_bytes(pickle.dumps(first)[:20])  # cut short
    assert pdll.parse_pdll_file(source) == first
    assert pickle.loads(cached.read_bytes()) == first  # written again, whole


def test_no_cache_when_turned_off(tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRAPHOPT_NO_CACHE", "1")
    source = tmp_path / "rules.pdll"
    source.write_text(RULE.format(name="CollapseRelus"))
    assert [r.name for r in pdll.parse_pdll_file(source).rules] == ["CollapseRelus"]
    assert _pickles(cache) == []


def test_a_read_only_cache_folder_is_no_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the cache folder would go")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    monkeypatch.delenv("GRAPHOPT_NO_CACHE", raising=False)
    source = tmp_path / "rules.pdll"
    source.write_text(RULE.format(name="CollapseRelus"))
    assert [r.name for r in pdll.parse_pdll_file(source).rules] == ["CollapseRelus"]
    assert [p.name for p in tmp_path.iterdir() if p.suffix == ".tmp"] == []
