"""docker/onstart.sh, run for real on the CPU: into a fresh virtual environment that sees this one's packages (so
torch is not downloaded again), it installs the training package from a copy of this checkout, proves the install
with the probe's sentinel and runs the command it was given; a broken pin or a missing module stops it loudly."""

import shutil
import subprocess
import sys
import sysconfig
from importlib.metadata import version
from pathlib import Path

import pytest

from training.probe import SENTINEL

ROOT = Path(__file__).resolve().parent.parent
ONSTART = ROOT / "docker" / "onstart.sh"
AGENT_STAND_IN = "AGENT_STARTED"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def box(tmp_path_factory):
    """A venv standing in for a stock PyTorch image, and the training package as the box would fetch it."""
    where = tmp_path_factory.mktemp("box")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where / "venv")], check=True, timeout=120)
    python = where / "venv" / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    # This environment's packages (torch, pip, setuptools) as the stock image's; a plain path line, so this
    # checkout's own editable install is not among them and `training` comes only from what onstart installs.
    Path(site, "stock-image.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    package = where / "package"
    package.mkdir()
    shutil.copy(ROOT / "pyproject.toml", package)
    shutil.copytree(ROOT / "training", package / "training", ignore=shutil.ignore_patterns("__pycache__"))
    return {"python": python, "package": package, "site": Path(site), "home": where}


def _onstart(box, *command, **env) -> subprocess.CompletedProcess:
    base = {"PATH": "/usr/bin:/bin", "HOME": str(box["home"]), "PYTHON": str(box["python"]),
            "TRAINING_PACKAGE": str(box["package"]),
            # Offline: nothing is downloaded, so a pin this environment cannot satisfy fails as on a real box.
            "TRAINING_PIP_ARGS": "--no-index --no-deps --no-build-isolation",
            "TRAINING_PINS": " ".join(f"{name}=={version(name)}" for name in ("torch", "triton", "transformers",
                                                                               "peft"))}
    base.update(env)
    return subprocess.run(["bash", str(ONSTART), *command], cwd=box["home"], env=base, capture_output=True,
                          text=True, timeout=600)


def _lines(result) -> list[str]:
    return (result.stdout + result.stderr).splitlines()


def test_it_installs_proves_and_starts_the_agent(box):
    result = _onstart(box, str(box["python"]), "-c", f"import training; print('{AGENT_STAND_IN}', training.__file__)")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = _lines(result)
    assert SENTINEL in lines
    started = next(line for line in lines if line.startswith(AGENT_STAND_IN))
    # The command ran after the probe, on the package onstart installed (not this checkout).
    assert lines.index(SENTINEL) < lines.index(started)
    assert started.split()[1].startswith(str(box["site"]))


@pytest.mark.parametrize("case, env", [
    ("a pin no index has", {"TRAINING_PINS": "peft==0.0.1"}),
    ("a module the probe cannot import", {"TRAINING_PROBE_EXTRA": "no_such_module_for_onstart"}),
    ("no package", {"TRAINING_PACKAGE": ""}),
])
def test_it_fails_loudly_without_the_sentinel(box, case, env):
    result = _onstart(box, str(box["python"]), "-c", f"print('{AGENT_STAND_IN}')", **env)
    assert result.returncode != 0, case
    lines = _lines(result)
    assert not any(SENTINEL in line for line in lines), case
    assert AGENT_STAND_IN not in lines, f"{case}: the agent must not start"
    assert any(line.startswith("onstart: FAILED:") for line in lines), case


def test_a_broken_pin_is_pip_s_failure_not_a_later_one(box):
    result = _onstart(box, "true", TRAINING_PINS="peft==0.0.1")
    assert "onstart: FAILED: pip could not install" in result.stderr
    assert "import torch" not in result.stdout  # the probe never ran


def test_it_runs_the_agent_by_default(box, tmp_path):
    # With no command it execs `python -m training.agent`; without FLEET_API_URL the agent stops at once, non-zero.
    result = _onstart(box)
    lines = _lines(result)
    assert SENTINEL in lines
    assert f"onstart: install proven; exec {box['python']} -m training.agent" in lines
    assert result.returncode != 0
