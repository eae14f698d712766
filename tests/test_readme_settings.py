"""The README's settings table names every environment variable the product reads."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
READS = re.compile(r"""(?:env_(?:str|int|float|bool|list|decimal)\(|os\.environ(?:\.get)?[\[(]|getenv\()"""
                   r"""\s*["']([A-Z][A-Z0-9_]+)["']""")


def _read_by_the_code() -> set[str]:
    names = set()
    for folder in ("config", "fleet", "runs"):
        for path in (REPO / folder).rglob("*.py"):
            names |= set(READS.findall(path.read_text()))
    return names


def _documented() -> set[str]:
    readme = (REPO / "README.md").read_text()
    table = readme.split("## Settings", 1)[1].split("\n## ", 1)[0]
    return {name for row in table.splitlines() if row.startswith("| `")
            for name in re.findall(r"`([A-Z][A-Z0-9_]+)`", row.split("|")[1])}


def test_every_variable_the_code_reads_is_in_the_settings_table():
    read = _read_by_the_code()
    assert len(read) > 60  # the pattern still finds the helpers' calls
    assert sorted(read - _documented()) == []


def test_the_table_names_no_variable_the_code_does_not_read():
    assert sorted(_documented() - _read_by_the_code()) == []
