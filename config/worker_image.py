"""The GPU worker image: the one place for its reference, its CUDA version and the libraries it pins.

WORKER_IMAGE and WORKER_IMAGE_CUDA are worked out here from one another, so they cannot disagree. Imports nothing
from Django (docs/runs.md, "config/worker_image.py").
"""

import re

REPOSITORY = "ghcr.io/moe-fleet/worker"
VERSION = "0.1.0"
DEFAULT_CUDA = "12.8"  # the 12.x most marketplace drivers run; "13.0" is the other variant we build

# The oldest driver branch each CUDA runtime needs on Linux (NVIDIA's CUDA toolkit release notes), for the CUDA
# versions PyTorch publishes wheels for.
MIN_DRIVER = {"12.6": "560", "12.8": "570", "13.0": "580"}

# What the tests and the H200 benchmarks ran with (bench/NOTES_*.md): torch 2.11.0, transformers 5.17.0, peft
# 0.21.0, and for the Gated DeltaNet families (Qwen3.5/3.6-MoE, Qwen3-Next) flash-linear-attention 0.6.0 on Triton
# 3.7.1: FLA's gated backward is wrong on Hopper with Triton >= 3.4.0 and < 3.7.1 and refuses to run there. Our
# kernels ran correctly and as fast on 3.7.1 as on 3.6.0.
PINS = {"torch": "2.11.0", "triton": "3.7.1", "transformers": "5.17.0", "peft": "0.21.0",
        "flash-linear-attention": "0.6.0"}
# torch 2.11.0 itself names triton==3.6.0, so pip cannot hold it and 3.7.1 in one install: the image installs torch
# first and its lock's Triton over it (docker/worker.Dockerfile). A stock image bootstrapped by docker/onstart.sh
# keeps its torch's Triton and gets no FLA; the probe fails a DeltaNet recipe there (training/probe.py).
TORCH_TRITON = "3.6.0"
STOCK_IMAGE_PINS = {"torch": PINS["torch"], "triton": TORCH_TRITON, "transformers": PINS["transformers"],
                    "peft": PINS["peft"]}

_TAG_CUDA = re.compile(r"cuda[-_]?(\d+\.\d+)", re.IGNORECASE)


def min_driver(cuda: str) -> str:
    try:
        return MIN_DRIVER[cuda]
    except KeyError:
        raise ValueError(f"CUDA {cuda!r} is not one the worker image is built for ({', '.join(MIN_DRIVER)})") from None


def reference(cuda: str = DEFAULT_CUDA, *, repository: str = REPOSITORY, version: str = VERSION) -> str:
    """"ghcr.io/moe-fleet/worker:0.1.0-cuda12.8": the tag names the CUDA version, so the image says what it needs."""
    min_driver(cuda)
    return f"{repository}:{version}-cuda{cuda}"


def cuda_in(image: str) -> str:
    """The CUDA version an image's tag names ("...:2.11.0-cuda12.8-cudnn9-runtime" -> "12.8"); "" when none."""
    tag = image.rpartition("/")[2].partition(":")[2]
    found = _TAG_CUDA.search(tag)
    return found.group(1) if found else ""


def resolve(image: str = "", cuda: str = "") -> tuple[str, str]:
    """(image, cuda) from what the environment gave, either, both or neither; ValueError when they disagree."""
    if not image:
        cuda = cuda or DEFAULT_CUDA
        return reference(cuda), cuda
    named = cuda_in(image)
    if cuda and named and cuda != named:
        raise ValueError(f"the image {image!r} is built for CUDA {named}, not {cuda}")
    cuda = cuda or named
    if not cuda:
        raise ValueError(f"the image {image!r} names no CUDA version in its tag; say which one it needs")
    min_driver(cuda)
    return image, cuda
