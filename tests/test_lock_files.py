"""The lock files in requirements/ against what they are made from (pyproject.toml, config/worker_image.py) and
against what installs them (scripts/setup, the Dockerfiles): every package pinned with its hashes, no lock older than
its inputs, and scripts/setup installing only from them."""

import os
import re
import shutil
import subprocess
import sys
from importlib.machinery import SourceFileLoader
from importlib.util import module_from_spec, spec_from_loader
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
SETUP = ROOT / "scripts" / "setup"


def _load_lock_script():
    loader = SourceFileLoader("lock_script", str(ROOT / "scripts" / "lock"))
    module = module_from_spec(spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    return module


lock = _load_lock_script()
PROJECT = lock.pyproject()


def _entries(path: Path) -> dict[str, list[tuple[str, str, list[str]]]]:
    """{name: [(pinned version, marker, hashes)]} of a lock file (a universal lock may pin a package once per Python
    version); a requirement that is not `name==version` fails here."""
    text = re.sub(r"\\\n", " ", path.read_text())
    entries = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        requirement, *options = line.split(" --hash=")
        found = re.fullmatch(r"([A-Za-z0-9._-]+)==(\S+?)(\s*;.*)?", requirement.strip())
        assert found, f"{path.name}: {requirement!r} is not pinned with =="
        pin = (found.group(2), (found.group(3) or "").strip(" ;"), [option.strip() for option in options])
        entries.setdefault(canonicalize_name(found.group(1)), []).append(pin)
    return entries


def _direct(extras) -> list[Requirement]:
    table = PROJECT["project"]
    requirements = [*table["dependencies"], *PROJECT["build-system"]["requires"]]
    requirements += [r for extra in extras for r in table["optional-dependencies"][extra]]
    return [Requirement(r) for r in requirements]


ALL_LOCKS = (*lock.PROJECT, lock.WORKER, *lock.TOOLS)


@pytest.mark.parametrize("project_lock", lock.PROJECT, ids=lambda x: x.name)
def test_every_direct_dependency_is_pinned_with_hashes_in_its_lock(project_lock):
    entries = _entries(project_lock.path)
    for requirement in _direct(project_lock.extras):
        name = canonicalize_name(requirement.name)
        if name == "torch":
            continue  # installed apart: scripts/setup
        assert name in entries, f"{project_lock.name} has no {requirement}: run scripts/lock"
        for version, _marker, hashes in entries[name]:
            assert requirement.specifier.contains(version, prereleases=True), f"{name}=={version}: {requirement}"
            assert hashes, f"{project_lock.name}: {name} has no hash"


@pytest.mark.parametrize("any_lock", ALL_LOCKS, ids=lambda x: x.name)
def test_every_package_in_every_lock_has_sha256_hashes_and_none_is_torch(any_lock):
    entries = _entries(any_lock.path)
    assert entries
    for name, pins in entries.items():
        for version, _marker, hashes in pins:
            assert hashes and all(re.fullmatch(r"sha256:[0-9a-f]{64}", h) for h in hashes), f"{name}=={version}"
    assert "torch" not in entries


def test_no_lock_is_older_than_what_it_is_made_from():
    assert lock.stale(PROJECT) == [], "a dependency list changed since the locks were made: run scripts/lock"


def test_a_changed_dependency_list_makes_every_lock_of_the_project_stale():
    for section, change in (("dependencies", "rich>=13"), ("test", "hypothesis>=6"), ("train", "accelerate>=1")):
        edited = {**PROJECT, "project": {**PROJECT["project"]}}
        table = edited["project"]
        if section == "dependencies":
            table["dependencies"] = [*table["dependencies"], change]
        else:
            table["optional-dependencies"] = {**table["optional-dependencies"]}
            table["optional-dependencies"][section] = [*table["optional-dependencies"][section], change]
        stale = set(lock.stale(edited))
        assert {project_lock.name for project_lock in lock.PROJECT} <= stale, section
        assert (lock.WORKER.name in stale) == (section == "train"), section


def test_the_smaller_locks_pin_what_the_largest_pins():
    # scripts/setup takes an install of the larger set as one of the smaller; that holds only if no pin differs.
    largest, *others = lock.PROJECT
    assert set(largest.extras) == set(PROJECT["project"]["optional-dependencies"])
    pins = {name: [pin[:2] for pin in found] for name, found in _entries(largest.path).items()}
    for smaller in others:
        for name, found in _entries(smaller.path).items():
            assert [pin[:2] for pin in found] == pins.get(name), f"{smaller.name}: {name}"


def _setup_extras_asked_for() -> set[str]:
    asked = set()
    for script in (ROOT / "scripts").iterdir():
        asked |= set(re.findall(r"^scripts/setup(?: (\S+))?(?=\s|$)", script.read_text(), re.M))
    return asked


def test_each_set_of_extras_scripts_setup_is_run_with_has_exactly_one_lock():
    assert {"train", "train,test"} <= _setup_extras_asked_for()
    headers = {project_lock.name: lock.recorded(project_lock.path, lock.EXTRAS_LINE) for project_lock in lock.PROJECT}
    for extras in (*_setup_extras_asked_for(), "", "test"):
        wanted = ",".join(sorted(set(filter(None, extras.split(","))))) or lock.NO_EXTRAS
        assert list(headers.values()).count(wanted) == 1, f"scripts/setup {extras}: {headers}"


def test_the_worker_lock_carries_the_train_extra_and_what_the_box_imports():
    entries = _entries(lock.WORKER.path)
    train = PROJECT["project"]["optional-dependencies"]["train"]
    for requirement in map(Requirement, (*train, *lock.WORKER_ALSO)):
        if requirement.name != "torch":
            assert canonicalize_name(requirement.name) in entries, requirement
            for version, _marker, _hashes in entries[canonicalize_name(requirement.name)]:
                assert requirement.specifier.contains(version), f"{requirement.name}=={version}: {requirement}"


def test_scripts_setup_installs_the_cpu_torch_the_locks_were_made_with():
    assert re.search(r"TORCH_SPEC:-([^}]*)}", SETUP.read_text()).group(1) == lock.TORCH_CPU


def test_the_control_plane_image_installs_only_from_its_lock():
    dockerfile = re.sub(r"\\\n", " ", (ROOT / "docker" / "control-plane.Dockerfile").read_text())
    installs = [command.strip() for command in re.findall(r"pip install ([^&\n]*)", dockerfile)]
    assert installs == ["--require-hashes --no-deps -r requirements/pip.txt",
                        "--require-hashes --no-deps -r requirements/control-plane.txt",
                        "--no-deps --no-build-isolation ."]
    assert re.search(r"^FROM python:3\.12-slim\$\{PYTHON_DIGEST:\+@\$\{PYTHON_DIGEST\}\}$", dockerfile, re.M)


@pytest.fixture
def checkout(tmp_path):
    """What scripts/setup reads, copied, with a .venv whose python logs every pip call instead of making it (and
    says torch is missing); scripts/lock --check runs for real."""
    for part in ("scripts", "requirements", "config"):
        shutil.copytree(ROOT / part, tmp_path / part, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/bash\ncase "$1" in\n  -m) echo "$*" >> {tmp_path}/calls; exit 0 ;;\n'
                      f'  -c) exit 1 ;;\nesac\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    return tmp_path


def _setup(checkout: Path, extras: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    result = subprocess.run([str(checkout / "scripts" / "setup"), extras], capture_output=True, text=True,
                            timeout=60, env={**os.environ, "PYTHON": "false"})
    calls = checkout / "calls"
    return result, calls.read_text().splitlines() if calls.exists() else []


def test_scripts_setup_installs_from_the_lock_with_hashes_and_then_nothing_more(checkout):
    result, calls = _setup(checkout, "train")
    assert result.returncode == 0, result.stderr
    assert calls == ["-m pip install --quiet --require-hashes --no-deps -r requirements/pip.txt",
                     "-m pip install --quiet --require-hashes --no-deps -r requirements/train-cpu.txt",
                     f"-m pip install --quiet {lock.TORCH_CPU}",
                     "-m pip install --quiet --no-deps --no-build-isolation -e .",
                     "-m pip check"]
    (checkout / "calls").unlink()
    result, calls = _setup(checkout, "train")
    assert result.returncode == 0 and calls == []


def test_scripts_setup_stops_at_a_lock_older_than_pyproject(checkout):
    pyproject = checkout / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('"PyYAML>=6",', '"PyYAML>=6",\n    "rich>=13",'))
    result, calls = _setup(checkout, "train,test")
    assert result.returncode != 0 and calls == []
    assert "older than pyproject.toml" in result.stderr and "run scripts/lock" in result.stderr


def test_scripts_setup_refuses_extras_that_no_lock_carries(checkout):
    result, calls = _setup(checkout, "train,gpu")
    assert result.returncode != 0 and calls == []
    assert "no lock in requirements/ carries the extras 'train,gpu'" in result.stderr
