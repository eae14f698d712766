"""The install probe prints its sentinel only when every import (and CUDA, where present) works, and, for a model
family with Gated DeltaNet layers on a CUDA build, only where they would train on FLA's kernels as they should."""

import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

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
    assert "experts kernels: loop on cpu (chosen by device)" in result.stdout  # no GPU here


def test_it_says_which_experts_kernels_a_box_will_run_and_refuses_a_path_that_does_not_exist():
    assert "experts kernels: triton_scatter on cpu (set by MOE_LORA_KERNELS)" in \
        _probe(MOE_LORA_KERNELS="triton_scatter").stdout
    result = _probe(MOE_LORA_KERNELS="cutlass")
    assert result.returncode == 1 and probe.SENTINEL not in result.stdout
    assert "experts kernels: FAILED MOE_LORA_KERNELS: unknown kernel path 'cutlass'" in result.stdout


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
    assert probe.main([]) == 1
    assert probe.SENTINEL not in capsys.readouterr().out


H200, RTX_PRO_6000 = ((9, 0), "NVIDIA H200"), ((12, 0), "NVIDIA RTX PRO 6000 Blackwell Workstation Edition")


@pytest.mark.parametrize("fla, triton, tilelang, device, refused", [
    (None, "3.7.1", False, H200, "flash-linear-attention is not installed: the Gated DeltaNet layers would run "
                                 "transformers' reference code"),
    ("0.6.0", "3.6.0", False, H200, "flash-linear-attention 0.6.0 refuses the Gated DeltaNet backward on NVIDIA "
                                    "H200 (sm_90) with Triton 3.6.0"),
    ("0.6.0", "3.4.0", False, ((9, 0), "GH200 480GB"), "refuses the Gated DeltaNet backward"),
    ("0.6.0", "3.6.0", False, (None, ""), "refuses the Gated DeltaNet backward on Hopper GPUs"),
    ("0.6.0", "3.6.0", True, H200, None),
    ("0.6.0", "3.7.1", False, H200, None),
    ("0.6.0", "3.3.1", False, H200, None),
    ("0.6.0", "3.6.0", False, RTX_PRO_6000, None),
])
def test_it_tells_when_deltanet_would_not_run_on_flas_kernels(fla, triton, tilelang, device, refused):
    problem = probe.deltanet_problem(fla, triton, tilelang, *device)
    assert problem is None if refused is None else refused in problem


@pytest.fixture
def gpu_box(monkeypatch):
    """A box with one GPU (H200 unless changed) and a CUDA torch; set(installed=..., found=...) fakes packages."""
    import torch

    box = {"device": H200, "installed": {"fla-core": "0.6.0", "triton": "3.7.1"}, "found": set()}
    monkeypatch.setattr(probe, "MODULES", ("torch",))
    monkeypatch.setattr(probe, "check_cuda", lambda: ("cuda: build 12.8, 1 device(s)", True))
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=0: box["device"][0])
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: box["device"][1])
    monkeypatch.setattr(probe, "_installed", lambda name: box["installed"].get(name))
    monkeypatch.setattr(probe, "_found", lambda name: name in box["found"])
    monkeypatch.setitem(sys.modules, "fla.ops.gated_delta_rule", types.ModuleType("fla.ops.gated_delta_rule"))
    return box


def _recipe(tmp_path, model_type):
    path = tmp_path / "recipe.yaml"
    path.write_text(f"model: {{config: {{model_type: {model_type}, vocab_size: 260}}}}\n"
                    "phases: [{name: cpt, kind: cpt, data: cpt.jsonl, steps: 1}]\n")
    return str(path)


def test_it_fails_a_deltanet_recipe_where_fla_is_missing(gpu_box, tmp_path, capsys):
    del gpu_box["installed"]["fla-core"]
    assert probe.main(["--recipe", _recipe(tmp_path, "qwen3_5_moe_text")]) == 1
    out = capsys.readouterr().out
    assert "deltanet (qwen3_5_moe): FAILED flash-linear-attention is not installed" in out
    assert probe.SENTINEL not in out and out.strip().endswith("probe failed: deltanet")


def test_it_fails_a_deltanet_recipe_that_fla_would_refuse_on_hopper(gpu_box, tmp_path, capsys):
    gpu_box["installed"]["triton"] = "3.6.0"
    assert probe.main(["--recipe", _recipe(tmp_path, "qwen3_next")]) == 1
    out = capsys.readouterr().out
    assert "FAILED flash-linear-attention 0.6.0 refuses the Gated DeltaNet backward on NVIDIA H200 (sm_90)" in out
    assert "install triton>=3.7.1 or tilelang" in out and probe.SENTINEL not in out
    gpu_box["found"].add("tilelang")  # FLA then takes tilelang's backward
    assert probe.main(["--recipe", _recipe(tmp_path, "qwen3_next")]) == 0


def test_it_passes_deltanet_on_a_stack_fla_runs_correctly_and_families_without_it_anywhere(gpu_box, tmp_path,
                                                                                          capsys):
    assert probe.main(["--family", "qwen3_5_moe"]) == 0
    out = capsys.readouterr().out
    assert "deltanet (qwen3_5_moe): fla 0.6.0, triton 3.7.1, no causal-conv1d (packed rows on our Triton kernel, " \
        "whole rows on PyTorch's conv1d), on NVIDIA H200" in out and out.strip().endswith(probe.SENTINEL)
    gpu_box["device"], gpu_box["installed"]["triton"] = RTX_PRO_6000, "3.6.0"
    assert probe.main(["--family", "qwen3_5_moe"]) == 0  # FLA refuses only on Hopper
    del gpu_box["installed"]["fla-core"]
    assert probe.main(["--recipe", _recipe(tmp_path, "qwen3_moe")]) == 0
    assert "model family: qwen3_moe (no linear attention)" in capsys.readouterr().out


def test_it_judges_a_gpu_less_build_for_hopper_and_a_cpu_torch_as_the_reference_by_design(gpu_box, monkeypatch,
                                                                                         capsys):
    import torch

    gpu_box["installed"]["triton"] = "3.6.0"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert probe.main(["--family", "qwen3_5_moe"]) == 1  # the worker image's build: no GPU, any GPU later
    assert "refuses the Gated DeltaNet backward on Hopper GPUs with Triton 3.6.0" in capsys.readouterr().out
    monkeypatch.setattr(torch.version, "cuda", None)
    assert probe.main(["--family", "qwen3_5_moe"]) == 0
    assert "deltanet (qwen3_5_moe): reference code on the CPU" in capsys.readouterr().out


def test_it_says_when_it_cannot_tell_the_family(gpu_box, tmp_path, capsys):
    assert probe.main(["--recipe", _recipe(tmp_path, "llama")]) == 1
    assert "model family: FAILED no row for model type 'llama'" in capsys.readouterr().out
    assert probe.main(["--recipe", str(tmp_path / "missing.yaml")]) == 1
    assert "model family: FAILED cannot tell it from" in capsys.readouterr().out
