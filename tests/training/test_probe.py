"""The install probe prints its sentinel only when every import (and CUDA, where present) works."""

import os
import subprocess
import sys
from pathlib import Path


from training import probe

REPO = Path(__file__).resolve().parents[2]


def _probe(**env):
    return subprocess.run([sys.executable, "-m", "training.probe"], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=120)


def test_it_prints_the_sentinel_when_everything_imports():
    result = _probe()
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().splitlines()[-1] == probe.SENTINEL
    assert "import peft: ok" in result.stdout and "cuda:" in result.stdout


def test_it_fails_without_the_sentinel_when_a_module_is_missing():
    result = _probe(TRAINING_PROBE_EXTRA="no_such_module_for_the_probe")
    assert result.returncode == 1
    assert probe.SENTINEL not in result.stdout
    assert "import no_such_module_for_the_probe: FAILED ModuleNotFoundError" in result.stdout


def test_it_reports_an_old_driver_as_cuda_error_803(monkeypatch, capsys):
    import torch

    def init():
        raise RuntimeError("CUDA driver initialization failed: Error 803: system has unsupported display driver / "
                           "cuda driver combination")

    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(probe, "_gpu_present", lambda: True)
    monkeypatch.setattr(torch.cuda, "init", init)
    line, healthy = probe.check_cuda()
    assert not healthy and line.startswith("CUDA error 803: the host's NVIDIA driver is too old")
    monkeypatch.setattr(probe, "MODULES", ("torch",))
    assert probe.main() == 1
    assert probe.SENTINEL not in capsys.readouterr().out
