"""The install step's import probe: `python -m training.probe`.

Imports everything the trainer needs, initialises CUDA where a GPU is present (and runs one matmul on it), and prints
SENTINEL only if all of that worked; otherwise it says what failed and exits non-zero. A host whose driver is older
than the build's CUDA is reported as "CUDA error 803". Remote exit codes get lost (a `| tail`, an SSH wrapper), so
the installer looks for the sentinel line, not the status.

Extra modules to import can be named in TRAINING_PROBE_EXTRA (comma-separated), e.g. boto3 when the run writes to
S3; the tests use it to simulate a missing module.
"""

import glob
import importlib
import os
import shutil
import sys

SENTINEL = "TRAINING_PROBE_OK"
MODULES = (
    "torch", "triton", "transformers", "peft", "safetensors", "yaml", "httpx",
    "training.moe_lora", "training.lora", "training.guards", "training.train",
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


def main():
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
    if failed:
        print(f"probe failed: {', '.join(failed)}")
        return 1
    print(SENTINEL)
    return 0


if __name__ == "__main__":
    sys.exit(main())
