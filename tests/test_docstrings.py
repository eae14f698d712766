"""Docstrings stay a sentence or two: the reasoning behind a module lives in docs/ and bench/NOTES_*.md, where it can
be read whole, not in essays a reader scrolls past to reach the code."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("config", "fleet", "runs", "training")
MAX_WORDS = 60


def _docstrings():
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                    text = ast.get_docstring(node)
                    if text:
                        where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 1)} {getattr(node, 'name', '')}"
                        yield where, text


def test_it_finds_the_docstrings():
    assert sum(1 for _ in _docstrings()) > 300


@pytest.mark.parametrize("package", PACKAGES)
def test_no_docstring_is_an_essay(package):
    long = [f"{where} ({len(text.split())} words)" for where, text in _docstrings()
            if where.startswith(package + "/") and len(text.split()) > MAX_WORDS]
    assert not long, f"docstrings over {MAX_WORDS} words; keep a sentence or two, move the rest to docs/:\n" + \
        "\n".join(long)
