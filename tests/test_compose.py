"""The compose file cannot be run here (no Docker engine), so it is checked for what would break it."""

import importlib
import re
import shlex
from pathlib import Path

import pytest
import yaml
from django.core.management import get_commands

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]
OUR_SERVICES = {name: spec for name, spec in SERVICES.items() if "build" in spec}


def _command(spec) -> list[str]:
    command = spec.get("command")
    if command is None:
        dockerfile = (ROOT / spec["build"]["dockerfile"]).read_text()
        command = re.search(r'^CMD\s+(\[.*\])', dockerfile, re.M).group(1)
        return yaml.safe_load(command)
    return command if isinstance(command, list) else shlex.split(command)


def test_it_has_the_whole_stack():
    assert {"postgres", "redis", "minio", "web", "worker", "beat"} <= set(SERVICES)
    images = {name: spec.get("image", "") for name, spec in SERVICES.items()}
    assert images["postgres"].startswith("postgres") and images["redis"].startswith("redis")


@pytest.mark.parametrize("name", sorted(OUR_SERVICES))
def test_it_runs_a_real_entry_point(name):
    argv = _command(OUR_SERVICES[name])
    program = argv[0]
    if program == "gunicorn":
        module, _, attr = argv[1].partition(":")
        assert callable(getattr(importlib.import_module(module), attr or "application"))
    elif program == "celery":
        assert argv[1] == "-A"
        app = importlib.import_module(argv[2]).celery_app
        assert argv[3] in ("worker", "beat")
        assert app.main == "config"
    elif program == "python":
        assert argv[1] == "manage.py" and (ROOT / "manage.py").exists()
        assert argv[2] in get_commands(), f"manage.py has no command {argv[2]!r}"
    else:
        pytest.fail(f"{name}: unknown program {program!r}")


def test_it_runs_exactly_one_beat():
    beats = [name for name, spec in OUR_SERVICES.items() if "beat" in _command(spec)]
    assert beats == ["beat"]
    assert "replicas" not in SERVICES["beat"].get("deploy", {})


def test_it_copies_only_paths_that_exist_into_the_image():
    dockerfile = (ROOT / "docker" / "control-plane.Dockerfile").read_text()
    sources = [line.split()[1] for line in dockerfile.splitlines() if line.startswith("COPY")]
    assert sources
    for source in sources:
        assert (ROOT / source).exists(), f"COPY {source}: no such path"


def test_it_waits_for_healthy_databases():
    for name in ("web", "worker", "beat"):
        assert "migrate" in SERVICES[name]["depends_on"]
    assert SERVICES["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert "healthcheck" in SERVICES["postgres"] and "healthcheck" in SERVICES["redis"]
