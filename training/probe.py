"""The install step's import probe: `python -m training.probe` prints SENTINEL only if the trainer's imports and CUDA
work (docs/training.md, "training/probe.py")."""

import argparse
import glob
import importlib
import importlib.metadata
import importlib.util
import os
import shutil
import sys
from pathlib import Path

from packaging.version import Version

from training import families

SENTINEL = "TRAINING_PROBE_OK"
MODULES = (
    "torch", "triton", "transformers", "peft", "safetensors", "yaml", "httpx",
    "training.moe_lora", "training.lora", "training.guards", "training.train", "training.evaluation.generate",
)


def _gpu_present():
    return bool(glob.glob("/dev/nvidia[0-9]*")) or shutil.which("nvidia-smi") is not None


def check_cuda():
    """A line about CUDA, and whether it is healthy."""
    import torch

    if torch.version.cuda is None:
        # A CPU-only torch on a GPU host is a broken install, not a CPU run.
        gpu = _gpu_present()
        return f"cuda: none in this build (CPU only){'; but this host has a GPU' if gpu else ''}", not gpu
    if not _gpu_present() and not torch.cuda.is_available():
        return f"cuda: build {torch.version.cuda}, no GPU on this host (CPU only)", True
    try:
        torch.cuda.init()
        count = torch.cuda.device_count()
        if count == 0:
            return f"cuda: build {torch.version.cuda}, GPU device files present but no device visible", False
        x = torch.ones(64, 64, device="cuda", dtype=torch.bfloat16)
        float((x @ x).sum())
        names = ", ".join(torch.cuda.get_device_name(i) for i in range(count))
        return f"cuda: build {torch.version.cuda}, {count} device(s): {names}", True
    except Exception as exc:  # noqa: BLE001 - every CUDA failure is reported, none is fatal to the probe itself
        text = str(exc)
        if "803" in text or "unsupported display driver" in text or "driver on your system is too old" in text:
            return (f"CUDA error 803: the host's NVIDIA driver is too old for this build's CUDA {torch.version.cuda} "
                    f"(rent a host with a newer driver): {text.strip()}"), False
        return f"cuda: initialisation failed: {type(exc).__name__}: {text.strip()}", False


# FLA's own bounds (fla/ops/common/chunk_o.py, chunk_bwd_dqkwg): the gated backward is wrong on Hopper in between.
HOPPER_BAD_TRITON = (Version("3.4.0"), Version("3.7.1"))
FAST_PATH_HINT = ("the worker image carries them; elsewhere install flash-linear-attention==0.6.0 with "
                  "triton>=3.7.1 (or tilelang)")


def _installed(distribution):
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _found(module):
    return importlib.util.find_spec(module) is not None


def is_hopper(capability, device_name):
    """As FLA tells Hopper: compute capability 9.x or an "NVIDIA H..." name."""
    return capability[0] == 9 or "NVIDIA H" in device_name


def check_experts():
    """A line about the experts' kernel path a run here would take, and whether MOE_LORA_KERNELS names a real one."""
    import torch

    from training.moe_lora import Kernels

    try:
        kernels = Kernels()
    except ValueError as exc:
        return f"experts kernels: FAILED MOE_LORA_KERNELS: {exc}", False
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    how = "set by MOE_LORA_KERNELS" if kernels.path else "chosen by device"
    return f"experts kernels: {kernels.choose(device)} on {device.type} ({how})", True


def deltanet_problem(fla, triton, tilelang, capability, device_name) -> str | None:
    """Why Gated DeltaNet would not train on FLA's kernels on this device, or None. fla, triton: the installed
    versions (None: not installed); capability, device_name: the GPU's, or None and "" to judge for Hopper."""
    if fla is None:
        return (f"flash-linear-attention is not installed: the Gated DeltaNet layers would run transformers' "
                f"reference code, correct but many times slower ({FAST_PATH_HINT})")
    low, high = HOPPER_BAD_TRITON
    where = "Hopper GPUs" if capability is None else f"{device_name} (sm_{capability[0]}{capability[1]})"
    hopper = capability is None or is_hopper(capability, device_name)
    if hopper and triton is not None and low <= Version(triton) < high and not tilelang:
        return (f"flash-linear-attention {fla} refuses the Gated DeltaNet backward on {where} with Triton {triton}: "
                f"Triton >= {low} and < {high} computes its gated chunk_bwd_dqkwg wrongly there; install "
                f"triton>={high} or tilelang ({FAST_PATH_HINT})")
    return None


def check_deltanet(family):
    """A line about the Gated DeltaNet kernels a run of this family would get, and whether that is fine."""
    import torch

    fla, triton = _installed("fla-core"), _installed("triton")
    conv = "causal-conv1d" if _found("causal_conv1d") else \
        "no causal-conv1d (packed rows on our Triton kernel, whole rows on PyTorch's conv1d)"
    if torch.version.cuda is None:
        return f"deltanet ({family}): reference code on the CPU", True
    gpu = torch.cuda.is_available() and torch.cuda.device_count() > 0
    capability = torch.cuda.get_device_capability(0) if gpu else None
    device_name = torch.cuda.get_device_name(0) if gpu else ""
    problem = deltanet_problem(fla, triton, _found("tilelang"), capability, device_name)
    if problem:
        return f"deltanet ({family}): FAILED {problem}", False
    if gpu:
        try:
            importlib.import_module("fla.ops.gated_delta_rule")
        except Exception as exc:  # noqa: BLE001 - a broken install can raise anything at import
            return f"deltanet ({family}): FAILED fla does not import: {type(exc).__name__}: {exc}", False
    on = device_name or "any GPU (none here)"
    return f"deltanet ({family}): fla {fla}, triton {triton}, {conv}, on {on}", True


def recipe_family(path):
    """(model type, its family or None) of a recipe's model: by its config, or the checkpoint's config read from
    its path or hub id."""
    from training.recipe import parse_recipe_text, validate

    path = Path(path)
    raw = parse_recipe_text(path.read_text(), as_json=path.suffix == ".json")
    model = validate(raw, base_dir=path.parent, data_on_disk=False)["model"]
    if "config" in model:
        return model["config"]["model_type"], families.family_named(model["config"]["model_type"])
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model["path"])
    return config.model_type, families.find_family(config)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m training.probe", description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", help="also check the kernels this recipe's model family needs")
    parser.add_argument("--family", help="the same for a model type (qwen3_5_moe, qwen3_next, ...)")
    args = parser.parse_args(argv)
    extra = [m.strip() for m in os.environ.get("TRAINING_PROBE_EXTRA", "").split(",") if m.strip()]
    failed = []
    for name in (*MODULES, *extra):
        try:
            module = importlib.import_module(name)
            print(f"import {name}: ok {getattr(module, '__version__', '')}".rstrip())
        except Exception as exc:  # noqa: BLE001 - a broken install can raise anything at import
            print(f"import {name}: FAILED {type(exc).__name__}: {exc}")
            failed.append(name)
    if "torch" not in failed:
        line, healthy = check_cuda()
        print(line)
        if not healthy:
            failed.append("cuda")
        line, healthy = check_experts()
        print(line)
        if not healthy:
            failed.append("experts kernels")
    if "torch" not in failed and "cuda" not in failed and (args.recipe or args.family):
        failure, line = _family_check(args)
        print(line)
        if failure:
            failed.append(failure)
    if failed:
        print(f"probe failed: {', '.join(failed)}")
        return 1
    print(SENTINEL)
    return 0


def _family_check(args):
    """(what failed or None, the line to print)."""
    try:
        model_type, family = ((args.family, families.family_named(args.family)) if args.family
                              else recipe_family(args.recipe))
    except Exception as exc:  # noqa: BLE001 - an unreadable recipe or model config is the probe's to report
        return "model family", f"model family: FAILED cannot tell it from {args.recipe}: {type(exc).__name__}: {exc}"
    if family is None:
        return "model family", f"model family: FAILED no row for model type {model_type!r} in training/families.py"
    if not family.linear_attention:
        return None, f"model family: {family.name} (no linear attention)"
    line, healthy = check_deltanet(family.name)
    return None if healthy else "deltanet", line


if __name__ == "__main__":
    sys.exit(main())
