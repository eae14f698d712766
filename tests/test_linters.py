"""ruff over the code and mypy over the product packages, with their configuration in pyproject.toml: a finding of
either fails the suite with its output."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
PACKAGES = ["config", "fleet", "runs", "training"]


def _run(command: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=240)


def test_ruff_finds_nothing():
    result = _run([str(BIN / "ruff"), "check", "--no-cache", "--output-format", "concise",
                   *PACKAGES, "bench", "scripts/lock", "tests"])
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_finds_nothing():
    # Its cache stays with the checkout (.mypy_cache, ignored), which makes a second run take seconds.
    result = _run([str(BIN / "mypy"), *PACKAGES])
    assert result.returncode == 0, result.stdout + result.stderr
