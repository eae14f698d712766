# The GPU worker image that runs rent: the MoE-LoRA trainer, its Triton kernels and the on-box agent.
#
# CUDA is a build argument with one variant per driver generation (config/worker_image.py, which the settings read,
# is the source of truth and tests/test_worker_image.py holds this file to it):
#   12.8 (driver >= 570, what most marketplace hosts run; the default):
#     docker build -f docker/worker.Dockerfile -t ghcr.io/moe-fleet/worker:0.1.0-cuda12.8 .
#   13.0 (driver >= 580):
#     docker build -f docker/worker.Dockerfile --build-arg CUDA_VERSION=13.0 --build-arg CUDA_PATCH=0 \
#       -t ghcr.io/moe-fleet/worker:0.1.0-cuda13.0 .
# The tag names the CUDA version: WORKER_IMAGE=...-cuda13.0 makes runs rank only offers whose driver runs it.
#
# The base is pinned by digest once one is recorded in CUDA_DIGEST, one per CUDA variant; none is yet.
# `docker buildx imagetools inspect nvidia/cuda:12.8.1-runtime-ubuntu24.04` prints it: pass
# --build-arg CUDA_DIGEST=sha256:... with that variant's CUDA_VERSION. Left empty, the build takes whatever the tag
# names on the day.
ARG CUDA_VERSION=12.8
ARG CUDA_PATCH=1
ARG CUDA_DIGEST=
FROM nvidia/cuda:${CUDA_VERSION}.${CUDA_PATCH}-runtime-ubuntu24.04${CUDA_DIGEST:+@${CUDA_DIGEST}}

ARG CUDA_VERSION
# The torch the tests and the H200 benchmarks ran with (bench/NOTES_*.md), mirrored by config/worker_image.PINS;
# requirements/worker.txt holds triton, transformers, peft and flash-linear-attention to the same table (scripts/lock
# makes it from there).
ARG TORCH_VERSION=2.11.0

# Every RUN fails on the first failing command, including one inside a pipe.
SHELL ["/bin/bash", "-euo", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 PIP_NO_CACHE_DIR=1 \
    PATH=/opt/venv/bin:$PATH FLEET_WORKDIR=/workspace/fleet-run

# Triton compiles its launcher stubs with a C compiler against Python's headers on first use, so both stay.
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv python3-dev gcc libc6-dev ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/venv

# torch from PyTorch's index for this CUDA (cu128, cu130), pinned but without hashes: no lock covers that index yet,
# so torch and what only it needs (the CUDA libraries) are the one unhashed part of the image. Then everything else
# at its locked version and hash (requirements/worker.txt, triton and flash-linear-attention included), over what
# torch brought: torch 2.11.0 names triton 3.6.0, on which FLA's Gated DeltaNet backward is wrong on Hopper and
# refuses to run, so the lock's 3.7.1 replaces it (config/worker_image.py). pip check then finds exactly that pin
# unmet and nothing else. causal-conv1d is not installed (it builds against torch with nvcc, which this runtime base
# lacks): the DeltaNet short convolution runs in PyTorch, one sample of a packed row at a time.
COPY requirements/pip.txt requirements/worker.txt /opt/requirements/
RUN pip install --require-hashes --no-deps -r /opt/requirements/pip.txt \
    && pip install --index-url "https://download.pytorch.org/whl/cu${CUDA_VERSION//./}" "torch==${TORCH_VERSION}" \
    && pip install --require-hashes --no-deps -r /opt/requirements/worker.txt \
    && { pip check > /tmp/pip-check.txt || true; } \
    && if grep -v -e "^torch ${TORCH_VERSION}[+a-z0-9]* has requirement triton==" \
            -e "^No broken requirements found" /tmp/pip-check.txt; then \
        echo "worker image: pip check found broken requirements (above)" >&2; exit 1; fi \
    && rm /tmp/pip-check.txt

# Only `training` (it imports no Django), as a source tree on the path so its example recipes and data come along.
COPY training /opt/fleet/training
ENV PYTHONPATH=/opt/fleet

# The install probe must print its sentinel; its exit status alone is not trusted (seed report: a `| tail` once
# ate pip's failure and three boxes died later with "No module named peft"). With no GPU at build time it imports
# everything, checks that torch is a CUDA build, and that a Gated DeltaNet family would train on FLA's kernels on
# any GPU (judged for Hopper, the strictest).
RUN status=0; python -m training.probe --family qwen3_5_moe > /tmp/probe.log 2>&1 || status=$?; cat /tmp/probe.log; \
    if [ "$status" -ne 0 ] || ! grep -qx TRAINING_PROBE_OK /tmp/probe.log; then \
        echo "worker image: the install probe failed (exit ${status}, or no sentinel line)" >&2; exit 1; fi; \
    python -c "import torch; assert torch.version.cuda == '${CUDA_VERSION}', torch.version.cuda"; \
    rm /tmp/probe.log

LABEL org.opencontainers.image.title="moe-fleet worker" fleet.cuda="${CUDA_VERSION}"
WORKDIR /workspace
# CMD, not ENTRYPOINT: RunPod runs its onstart as the container's arguments (`bash -c ...`), which must replace this.
CMD ["python", "-m", "training.agent"]
