"""The worker image cannot be built here (no Docker engine), so its Dockerfile is parsed and checked against the
settings the launcher and the ranking read: image, CUDA version and driver floor must agree."""

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

from config import worker_image
from fleet.offers.ranked import for_worker_image, run_settings
from fleet.ranking import OfferFilters
from runs.supervisor import AGENT_COMMAND
from training.probe import SENTINEL

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = (ROOT / "docker" / "worker.Dockerfile").read_text()
ONSTART = (ROOT / "docker" / "onstart.sh").read_text()
WORKER_LOCK = (ROOT / "requirements" / "worker.txt").read_text()


def _instructions(text: str) -> list[tuple[str, str]]:
    joined = re.sub(r"\\\n", " ", text)
    return [tuple(line.split(None, 1)) for line in joined.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


INSTRUCTIONS = _instructions(DOCKERFILE)
ARGS = dict(arg.split("=", 1) for kind, arg in INSTRUCTIONS if kind == "ARG" and "=" in arg)
RUNS = [body for kind, body in INSTRUCTIONS if kind == "RUN"]


def test_its_cuda_version_is_the_settings_and_the_ranking_filters():
    cuda = ARGS["CUDA_VERSION"]
    assert cuda == worker_image.DEFAULT_CUDA == settings.WORKER_IMAGE_CUDA
    assert settings.WORKER_IMAGE == worker_image.reference(cuda) and settings.WORKER_IMAGE.endswith(f"-cuda{cuda}")
    _recipe, filters = run_settings(None)
    assert filters.min_cuda == float(cuda)
    assert filters.min_driver_version == worker_image.MIN_DRIVER[cuda] == settings.WORKER_IMAGE_MIN_DRIVER


def test_the_pure_rankings_defaults_name_a_cuda_and_its_driver_from_the_image_table():
    # For code that ranks without settings: the same (CUDA, driver) pair as the worker image's table.
    assert OfferFilters().min_driver_version == worker_image.MIN_DRIVER[f"{OfferFilters().min_cuda:g}"]
    assert settings.WORKER_IMAGE_CUDA in worker_image.MIN_DRIVER


def test_it_builds_from_a_cuda_base_named_by_the_build_argument():
    base = next(body for kind, body in INSTRUCTIONS if kind == "FROM")
    assert base.startswith("nvidia/cuda:${CUDA_VERSION}.")
    # The torch wheel index is worked out from the build argument in bash; the Dockerfile's own expression is run
    # for every CUDA version the image table knows, and must name that version's index.
    expression = next(re.search(r"download\.pytorch\.org/whl/(\S*\$\{CUDA_VERSION[^}]*\})", run).group(1)
                      for run in RUNS if "download.pytorch.org/whl/" in run)
    for cuda in worker_image.MIN_DRIVER:
        out = subprocess.run(["bash", "-c", f'echo "{expression}"'], env={"CUDA_VERSION": cuda},
                             capture_output=True, text=True, check=True).stdout.strip()
        assert out == "cu" + cuda.replace(".", "")


def test_it_pins_what_the_tests_and_benchmarks_ran_with():
    # torch by its build argument; the rest by the lock the image installs with hashes.
    locked = dict(re.findall(r"^([a-z0-9-]+)==(\S+) ", WORKER_LOCK, re.M))
    pinned = {name: ARGS["TORCH_VERSION"] if name == "torch" else locked[name] for name in worker_image.PINS}
    assert pinned == worker_image.PINS
    assert set(pinned) == {"torch", "triton", "transformers", "peft", "flash-linear-attention"}
    assert locked["fla-core"] == worker_image.PINS["flash-linear-attention"]


def test_its_triton_is_one_on_which_flas_deltanet_backward_runs_on_hopper():
    from training.probe import deltanet_problem

    pins = worker_image.PINS
    assert deltanet_problem(pins["flash-linear-attention"], pins["triton"], False, None, "") is None
    assert deltanet_problem(pins["flash-linear-attention"], worker_image.TORCH_TRITON, False, None, "")
    assert "--family qwen3_5_moe" in _probe_step()  # the build proves it with the installed versions


def test_a_stock_image_keeps_its_torchs_triton_because_pip_cannot_hold_both():
    onstart_pins = re.search(r'TRAINING_PINS-([^}]*)}', ONSTART).group(1).split()
    assert onstart_pins == [f"{name}=={version}" for name, version in worker_image.STOCK_IMAGE_PINS.items()]
    assert f"triton=={worker_image.TORCH_TRITON}" in onstart_pins and f"torch=={worker_image.PINS['torch']}" in \
        onstart_pins


def test_it_installs_everything_but_torch_from_its_lock_with_hashes_over_what_torch_brought():
    installs = [re.sub(r"\s+", " ", command).strip()
                for run in RUNS for command in re.findall(r"pip install ([^&]*)", run)]
    copied = next(body.split() for kind, body in INSTRUCTIONS if kind == "COPY" and "requirements/worker.txt" in body)
    assert copied == ["requirements/pip.txt", "requirements/worker.txt", "/opt/requirements/"]
    assert installs[0] == "--require-hashes --no-deps -r /opt/requirements/pip.txt"
    # torch first, then the lock: its Triton replaces the one torch's own metadata names.
    assert installs[1].endswith(' "torch==${TORCH_VERSION}"')
    assert installs[2] == "--require-hashes --no-deps -r /opt/requirements/worker.txt"
    unhashed = [command for command in installs if "--require-hashes" not in command]
    assert unhashed == [installs[1]]
    assert "torch" not in dict(re.findall(r"^([a-z0-9-]+)==(\S+) ", WORKER_LOCK, re.M))


def _install_step() -> str:
    return next(run for run in RUNS if "requirements/worker.txt" in run)


@pytest.mark.parametrize("check_output, builds", [
    ("No broken requirements found.", True),
    ('torch 2.11.0+cu128 has requirement triton==3.6.0; platform_system == "Linux", but you have triton 3.7.1.',
     True),
    ('torch 2.11.0+cu128 has requirement triton==3.6.0; platform_system == "Linux", but you have triton 3.7.1.\n'
     "peft 0.21.0 has requirement accelerate>=0.21.0, but you have accelerate 0.20.0.", False),
    ("transformers 5.17.0 has requirement tokenizers<0.23, but you have tokenizers 0.23.1.", False),
])
def test_its_install_step_tolerates_only_torchs_own_triton_pin(tmp_path, check_output, builds):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "check-output").write_text(check_output + "\n")
    fake = bin_dir / "pip"
    fake.write_text(f'#!/bin/bash\nif [ "$1" = check ]; then cat {tmp_path / "check-output"}; exit 1; fi\nexit 0\n')
    fake.chmod(0o755)
    shell = json.loads(next(body for kind, body in INSTRUCTIONS if kind == "SHELL"))
    step = _install_step().replace("/tmp/pip-check.txt", str(tmp_path / "pip-check.txt"))
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "CUDA_VERSION": ARGS["CUDA_VERSION"],
           "TORCH_VERSION": ARGS["TORCH_VERSION"]}
    result = subprocess.run([*shell, step], env=env, capture_output=True, text=True, timeout=30)
    assert (result.returncode == 0) == builds, result.stderr
    if not builds:
        assert "pip check found broken requirements" in result.stderr


@pytest.mark.parametrize("digest, image", [
    ("", "nvidia/cuda:12.8.1-runtime-ubuntu24.04"),
    ("sha256:" + "ab" * 32, "nvidia/cuda:12.8.1-runtime-ubuntu24.04@sha256:" + "ab" * 32),
])
def test_its_base_is_pinned_by_the_digest_it_is_given(digest, image):
    base = next(body for kind, body in INSTRUCTIONS if kind == "FROM")
    env = {"CUDA_VERSION": ARGS["CUDA_VERSION"], "CUDA_PATCH": ARGS["CUDA_PATCH"], "CUDA_DIGEST": digest}
    out = subprocess.run(["bash", "-c", f'echo "{base}"'], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == image


def test_it_runs_the_agent():
    cmd = next(json.loads(body) for kind, body in INSTRUCTIONS if kind == "CMD")
    assert cmd == AGENT_COMMAND.split() and cmd[:2] == ["python", "-m"]
    assert importlib.util.find_spec(cmd[2]) is not None
    assert not any(kind == "ENTRYPOINT" for kind, _ in INSTRUCTIONS), "RunPod's onstart must be able to replace it"


def test_it_copies_only_paths_that_exist():
    sources = [body.split()[0] for kind, body in INSTRUCTIONS if kind == "COPY"]
    assert sources
    for source in sources:
        assert (ROOT / source).exists(), f"COPY {source}: no such path"


def test_no_exit_code_hides_behind_a_pipe():
    shell = json.loads(next(body for kind, body in INSTRUCTIONS if kind == "SHELL"))
    assert shell[0] == "/bin/bash" and "pipefail" in shell and "-euo" in shell
    kinds = [kind for kind, _ in INSTRUCTIONS]
    assert kinds.index("SHELL") < kinds.index("RUN")


def _probe_step() -> str:
    return next(run for run in RUNS if "training.probe" in run)


def _run_probe_step(tmp_path, fake_probe_output: str, fake_status: int) -> subprocess.CompletedProcess:
    """The Dockerfile's probe step under its own SHELL, with a `python` that prints what we say."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "probe-output").write_text(fake_probe_output + "\n")
    fake = bin_dir / "python"
    fake.write_text(f"#!/bin/bash\ncat {tmp_path / 'probe-output'}\nexit {fake_status}\n")
    fake.chmod(0o755)
    shell = json.loads(next(body for kind, body in INSTRUCTIONS if kind == "SHELL"))
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "CUDA_VERSION": ARGS["CUDA_VERSION"]}
    return subprocess.run([*shell, _probe_step()], env=env, capture_output=True, text=True, timeout=30)


def test_its_build_passes_only_with_the_sentinel(tmp_path):
    assert f"grep -qx {SENTINEL}" in _probe_step()
    assert _run_probe_step(tmp_path, f"import torch: ok\n{SENTINEL}", 0).returncode == 0


@pytest.mark.parametrize("output, status", [
    ("import peft: FAILED ModuleNotFoundError\nprobe failed: peft", 0),  # an exit code that lies
    (SENTINEL, 1),
    ("", 0),
])
def test_its_build_fails_without_the_sentinel(tmp_path, output, status):
    result = _run_probe_step(tmp_path, output, status)
    assert result.returncode != 0
    assert "install probe failed" in result.stderr


def test_a_profile_can_ask_for_more_but_never_less_than_the_image_needs():
    low = for_worker_image(OfferFilters(min_cuda=11.8, min_driver_version="535"), cuda="13.0", driver="580")
    assert (low.min_cuda, low.min_driver_version) == (13.0, "580")
    blank = for_worker_image(OfferFilters(min_driver_version=""), cuda="12.8", driver="570")
    assert blank.min_driver_version == "570"
    high = for_worker_image(OfferFilters(min_cuda=13.0, min_driver_version="580.65"), cuda="12.8", driver="570")
    assert (high.min_cuda, high.min_driver_version) == (13.0, "580.65")


def test_either_setting_gives_the_other():
    assert worker_image.resolve() == ("ghcr.io/moe-fleet/worker:0.1.0-cuda12.8", "12.8")
    assert worker_image.resolve(cuda="13.0") == ("ghcr.io/moe-fleet/worker:0.1.0-cuda13.0", "13.0")
    stock = "pytorch/pytorch:2.11.0-cuda12.8-cudnn9-runtime"
    assert worker_image.resolve(stock) == (stock, "12.8")
    assert worker_image.resolve("registry:5000/worker:dev", "13.0") == ("registry:5000/worker:dev", "13.0")


@pytest.mark.parametrize("image, cuda, words", [
    ("ghcr.io/moe-fleet/worker:0.1.0-cuda12.8", "13.0", "built for CUDA 12.8, not 13.0"),
    ("registry:5000/worker:dev", "", "names no CUDA version"),
    ("", "11.8", "not one the worker image is built for"),
])
def test_image_and_cuda_can_never_disagree(image, cuda, words):
    with pytest.raises(ValueError, match=words):
        worker_image.resolve(image, cuda)


def _settings(tmp_path, **env) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items()
             if k not in ("DATABASE_URL", "REDIS_URL", "SECRET_KEY", "WORKER_IMAGE", "WORKER_IMAGE_CUDA")}
    clean.update(DATA_DIR=str(tmp_path), DJANGO_SETTINGS_MODULE="config.settings", **env)
    code = ("import django, json; django.setup(); from django.conf import settings as s; "
            "from fleet.offers.ranked import run_settings; f = run_settings(None)[1]; "
            "print(json.dumps([s.WORKER_IMAGE, s.WORKER_IMAGE_CUDA, f.min_cuda, f.min_driver_version]))")
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=clean, capture_output=True, text=True,
                          timeout=60)


def test_the_13_0_image_makes_runs_rank_580_drivers(tmp_path):
    result = _settings(tmp_path, WORKER_IMAGE_CUDA="13.0")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1]) == ["ghcr.io/moe-fleet/worker:0.1.0-cuda13.0", "13.0", 13.0,
                                                          "580"]


def test_a_disagreeing_image_stops_the_process_at_start(tmp_path):
    result = _settings(tmp_path, WORKER_IMAGE="ghcr.io/moe-fleet/worker:0.1.0-cuda13.0", WORKER_IMAGE_CUDA="12.8")
    assert result.returncode != 0
    assert "WORKER_IMAGE / WORKER_IMAGE_CUDA: the image" in result.stderr
