"""Running out of GPU memory: knowing it whoever reports it (PyTorch's allocator, or CUDA itself as a Triton kernel's
launch says it), and autotuning past a candidate whose launch the card cannot hold (docs/training.md,
"training/out_of_memory.py")."""

import functools
import logging

import torch

_log = logging.getLogger(__name__)


# The CUDA libraries' own words for an allocation on the card that failed: cuBLAS's handle or workspace, cuDNN's,
# cuSOLVER's, cuSPARSE's and cuFFT's plans, and the driver API's code as cuda-python names it.
ALLOCATION_FAILED = ("CUBLAS_STATUS_ALLOC_FAILED", "CUDNN_STATUS_ALLOC_FAILED", "CUSOLVER_STATUS_ALLOC_FAILED",
                     "CUSPARSE_STATUS_ALLOC_FAILED", "CUFFT_ALLOC_FAILED", "CUDA_ERROR_OUT_OF_MEMORY")


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether `exc` is the GPU running out of memory: PyTorch's allocator's error, or one raised outside it, by CUDA
    ("Triton Error [CUDA]: out of memory", NCCL's "Cuda failure 'out of memory'") or a CUDA library that could not
    allocate ("CUBLAS_STATUS_ALLOC_FAILED")."""
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    if not isinstance(exc, RuntimeError):
        return False
    words = str(exc)
    lowered = words.lower()
    return ("cuda" in lowered and "out of memory" in lowered) or any(code in words for code in ALLOCATION_FAILED)


@functools.cache
def tune_past_out_of_memory() -> None:
    """Make every Triton autotuner (ours, FLA's) count a candidate whose launch runs out of memory as one that cannot
    run, as Triton counts one out of shared memory, instead of failing the run: a candidate that spills asks the
    driver for local memory for every thread the card holds (docs/training.md). Idempotent."""
    from triton.runtime.autotuner import Autotuner

    bench = getattr(Autotuner, "_bench", None)  # Triton's own, not a public API: a Triton without it goes unguarded
    if bench is None:
        _log.warning("this Triton's autotuner has no _bench: a candidate that runs out of memory ends the run")
        return

    @functools.wraps(bench)
    def bench_or_skip(self, *args, **kwargs):
        try:
            return bench(self, *args, **kwargs)
        except RuntimeError as exc:
            if not is_out_of_memory(exc):
                raise
            # base_fn: the jitted function under any heuristics, as the tuner itself names it in its own messages
            _log.warning("autotuning %s: candidate %s skipped, its launch ran out of GPU memory",
                         getattr(getattr(self, "base_fn", None), "__name__", "a kernel"), kwargs.get("config"))
            return [float("inf")] * 3  # never the fastest: the tuner takes another candidate

    Autotuner._bench = bench_or_skip

