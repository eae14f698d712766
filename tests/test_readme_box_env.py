"""The README's "On the box" table names every environment variable the box's code (`training/`) reads."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
READS = re.compile(r"""(?:os\.environ(?:\.get|\.setdefault)?[\[(]|getenv\()\s*["']([A-Z][A-Z0-9_]+)["']"""
                   r"""|["']([A-Z][A-Z0-9_]+)["']\s+(?:not\s+)?in\s+os\.environ""")


def _read_on_the_box() -> set[str]:
    names = set()
    for path in (REPO / "training").rglob("*.py"):
        names |= {name for found in READS.findall(path.read_text()) for name in found if name}
    return names


def _documented() -> set[str]:
    readme = (REPO / "README.md").read_text()
    table = readme.split("\n## On the box\n", 1)[1].split("\n## ", 1)[0]
    return {name for row in table.splitlines() if row.startswith("| `")
            for name in re.findall(r"`([A-Z][A-Z0-9_]+)`", row.split("|")[1])}


def test_every_variable_the_box_reads_is_in_the_on_the_box_table():
    read = _read_on_the_box()
    assert {"FLEET_API_URL", "FLEET_HEARTBEAT_S", "CONTAINER_ID"} <= read  # the pattern still finds the reads
    assert sorted(read - _documented()) == []


def test_the_table_names_no_variable_the_box_does_not_read():
    assert sorted(_documented() - _read_on_the_box()) == []
