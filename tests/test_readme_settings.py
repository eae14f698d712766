"""The README's tables name every environment variable the code reads: the dashboard's under "Settings", the box's
(`training/`) under "On the box"; and no variable the code no longer reads."""

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
NAME = r"""\s*["']([A-Z][A-Z0-9_]+)["']"""
DASHBOARD_READS = re.compile(r"(?:env_(?:str|int|float|bool|list|decimal)\(|os\.environ(?:\.get)?[\[(]|getenv\()"
                             + NAME)
BOX_READS = re.compile(r"(?:os\.environ(?:\.get|\.setdefault)?[\[(]|getenv\()" + NAME
                       + r"""|["']([A-Z][A-Z0-9_]+)["']\s+(?:not\s+)?in\s+os\.environ""")
# (README section, folders whose code reads the variables, how a read looks, names that prove the pattern still works)
TABLES = {
    "Settings": (("config", "fleet", "runs"), DASHBOARD_READS, {"DATABASE_URL", "SECRET_KEY", "REDIS_URL"}),
    "On the box": (("training",), BOX_READS, {"FLEET_API_URL", "FLEET_HEARTBEAT_S", "CONTAINER_ID"}),
}


def _read(folders, pattern) -> set[str]:
    names = set()
    for folder in folders:
        for path in (REPO / folder).rglob("*.py"):
            for found in pattern.findall(path.read_text()):
                names |= {found} if isinstance(found, str) else {name for name in found if name}
    return names


def _documented(section: str) -> set[str]:
    table = (REPO / "README.md").read_text().split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    return {name for row in table.splitlines() if row.startswith("| `")
            for name in re.findall(r"`([A-Z][A-Z0-9_]+)`", row.split("|")[1])}


@pytest.mark.parametrize("section", TABLES)
def test_every_variable_the_code_reads_is_in_its_table(section):
    folders, pattern, known = TABLES[section]
    read = _read(folders, pattern)
    assert known <= read  # the pattern still finds the reads
    assert sorted(read - _documented(section)) == []


@pytest.mark.parametrize("section", TABLES)
def test_the_table_names_no_variable_the_code_does_not_read(section):
    folders, pattern, _ = TABLES[section]
    assert sorted(_documented(section) - _read(folders, pattern)) == []
