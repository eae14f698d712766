"""The compose file cannot be run here (no Docker engine), so it is checked for what would break it."""

import importlib
import json
import re
import shlex
from pathlib import Path

import pytest
import yaml
from django.conf import settings
from django.core.management import get_commands
from django.urls import resolve

from config.health import healthz

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]
OUR_SERVICES = {name: spec for name, spec in SERVICES.items() if "build" in spec}
WORKERS = {name: spec for name, spec in OUR_SERVICES.items() if spec.get("command", [""])[3:4] == ["worker"]}


def _command(spec) -> list[str]:
    command = spec.get("command")
    if command is None:
        dockerfile = (ROOT / spec["build"]["dockerfile"]).read_text()
        command = re.search(r'^CMD\s+(\[.*\])', dockerfile, re.M).group(1)
        return yaml.safe_load(command)
    return command if isinstance(command, list) else shlex.split(command)


def _option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_it_has_the_whole_stack():
    assert {"postgres", "redis", "minio", "web", "worker-fast", "worker-slow", "beat"} <= set(SERVICES)
    images = {name: spec.get("image", "") for name, spec in SERVICES.items()}
    assert images["postgres"].startswith("postgres") and images["redis"].startswith("redis")
    assert images["minio"].startswith("minio/")


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


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_every_service_has_a_health_check(name):
    check = SERVICES[name].get("healthcheck")
    assert check and not check.get("disable"), f"{name} has no health check"
    assert check["test"][0] in ("CMD", "CMD-SHELL")


@pytest.mark.parametrize("name", sorted(OUR_SERVICES))
def test_its_health_checks_run_real_code(name):
    test = OUR_SERVICES[name]["healthcheck"]["test"]
    argv = test[1:] if test[0] == "CMD" else shlex.split(test[1])
    if argv[:2] == ["python", "-c"]:
        path = re.search(r"http://127\.0\.0\.1:8000(/[^'\"]*)", argv[2]).group(1)
        assert resolve(path).func is healthz  # exempt from the HTTPS redirect: tests/test_deploy_settings.py
        compile(argv[2], "healthcheck", "exec")
    elif argv[:2] == ["python", "-m"]:
        module = importlib.import_module(argv[2])
        assert callable(module.main)
    elif argv[:2] == ["python", "manage.py"]:
        assert argv[2] in get_commands()
    elif argv[0] == "celery":
        assert argv[1:4] == ["-A", "config", "inspect"] and "ping" in argv
        node = _option(argv, "-d").replace("$$HOSTNAME", "%h")
        assert node == _option(_command(OUR_SERVICES[name]), "-n"), "the ping must name this worker's node"
    else:
        pytest.fail(f"{name}: unknown health check {argv!r}")


def test_the_web_health_check_asks_for_an_allowed_host():
    # Django answers 400 to a Host it does not serve; the check sends the first ALLOWED_HOSTS entry.
    assert "ALLOWED_HOSTS" in SERVICES["web"]["healthcheck"]["test"][-1]
    assert "ALLOWED_HOSTS" in SERVICES["web"]["environment"]


def test_it_runs_exactly_one_beat():
    beats = [name for name, spec in OUR_SERVICES.items() if "beat" in _command(spec)]
    assert beats == ["beat"]
    assert "replicas" not in SERVICES["beat"].get("deploy", {})
    assert SERVICES["beat"]["container_name"], "a fixed name makes --scale beat=2 fail"
    assert settings.CELERY_BEAT_SCHEDULER == "django_celery_beat.schedulers:DatabaseScheduler"


def test_its_workers_consume_every_queue_apart():
    queues = {name: _option(_command(spec), "-Q") for name, spec in WORKERS.items()}
    assert queues == {"worker-fast": "fast", "worker-slow": "slow"}
    assert set(queues.values()) == set(settings.CELERY_TASK_QUEUES)
    routed = {route["queue"] for route in settings.CELERY_TASK_ROUTES.values()}
    assert routed == set(settings.CELERY_TASK_QUEUES)
    for spec in WORKERS.values():
        assert "container_name" not in spec, "a fixed name would stop --scale worker-...=N"


def test_its_workers_take_one_task_at_a_time_and_ack_late():
    assert settings.CELERY_WORKER_PREFETCH_MULTIPLIER == 1
    assert settings.CELERY_TASK_ACKS_LATE is True


def test_it_copies_only_paths_that_exist_into_the_image():
    dockerfile = (ROOT / "docker" / "control-plane.Dockerfile").read_text()
    sources = [line.split()[1] for line in dockerfile.splitlines() if line.startswith("COPY")]
    assert sources
    for source in sources:
        assert (ROOT / source).exists(), f"COPY {source}: no such path"


def test_it_waits_for_healthy_databases():
    for name in OUR_SERVICES:
        depends = SERVICES[name]["depends_on"]
        assert depends["postgres"]["condition"] == "service_healthy", name
        if name != "migrate":
            assert depends["migrate"]["condition"] == "service_completed_successfully", name
            assert depends["redis"]["condition"] == "service_healthy", name
    assert SERVICES["migrate"]["restart"] == "no"


def test_it_takes_secrets_from_the_environment():
    environment = OUR_SERVICES["web"]["environment"]
    for name in ("SECRET_KEY", "S3_SECRET_KEY"):
        assert re.fullmatch(rf"\$\{{{name}:\?[^}}]+\}}", environment[name]), f"{name} must be required"
    assert ":?" in environment["DATABASE_URL"]


def test_it_serves_the_web_port_on_loopback_only():
    # The TLS proxy on the host is the way in; plain HTTP on a public interface would skip it.
    for name, spec in SERVICES.items():
        for port in spec.get("ports", []):
            if name == "web" or port.rsplit(":", 1)[-1] == "8000":
                assert port.startswith("127.0.0.1:"), f"{name} publishes {port} on every interface"
    assert SERVICES["web"]["ports"], "the proxy needs the port on loopback"


def _policy(bucket: str) -> dict:
    text = (ROOT / "docker" / "minio-policy.json").read_text().replace("BUCKET", bucket)
    return json.loads(text)


def test_its_services_reach_minio_with_a_user_scoped_to_one_bucket():
    minio, setup = SERVICES["minio"]["environment"], SERVICES["minio-setup"]["environment"]
    control_plane = OUR_SERVICES["web"]["environment"]
    # The root key is MinIO's own, named by variables the product never gets.
    assert re.search(r"\$\{MINIO_ROOT_PASSWORD:\?", minio["MINIO_ROOT_PASSWORD"])
    assert "S3_" not in minio["MINIO_ROOT_USER"] + minio["MINIO_ROOT_PASSWORD"]
    for name, spec in OUR_SERVICES.items():
        assert not any("MINIO_ROOT" in str(value) for value in spec["environment"].values()), name
    # minio-setup makes the product's user from the same variables the control plane uses, before it starts.
    for key in ("S3_ACCESS_KEY", "S3_SECRET_KEY"):
        assert setup[key] == control_plane[key]
    for name in OUR_SERVICES:
        if name != "migrate":
            assert SERVICES[name]["depends_on"]["minio-setup"]["condition"] == "service_completed_successfully"
    script = (ROOT / "docker" / "minio-setup.sh").read_text()
    assert 'mc admin user add local "$S3_ACCESS_KEY" "$S3_SECRET_KEY"' in script
    assert 'mc admin policy attach local fleet-bucket --user "$S3_ACCESS_KEY"' in script
    mounted = {volume.split(":")[0]: volume.split(":")[1] for volume in SERVICES["minio-setup"]["volumes"]}
    assert mounted["./docker/minio-setup.sh"] in SERVICES["minio-setup"]["entrypoint"]
    assert mounted["./docker/minio-policy.json"] in script


def test_its_bucket_policy_reaches_that_bucket_and_nothing_else():
    policy = _policy("fleet-checkpoints")
    actions = {action for statement in policy["Statement"] for action in statement["Action"]}
    resources = {resource for statement in policy["Statement"] for resource in statement["Resource"]}
    assert all(statement["Effect"] == "Allow" for statement in policy["Statement"])
    assert resources == {"arn:aws:s3:::fleet-checkpoints", "arn:aws:s3:::fleet-checkpoints/*"}
    assert all(action.startswith("s3:") and "*" not in action for action in actions)
    # What the product and its boxes do: presigned puts and gets, listing a prefix, deleting a checkpoint.
    assert {"s3:PutObject", "s3:GetObject", "s3:ListBucket", "s3:DeleteObject"} <= actions
    assert not actions & {"s3:CreateBucket", "s3:DeleteBucket", "s3:PutBucketPolicy", "s3:ListAllMyBuckets"}
