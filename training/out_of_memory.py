"""Running out of GPU memory: knowing it whoever reports it (PyTorch's allocator, or CUDA itself as a Triton kernel's
launch says it), and autotuning past a candidate whose launch the card cannot hold (docs/training.md,
"training/out_of_memory.py")."""

import functools
import logging

import torch

_log = logging.getLogger(__name__)


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether `exc` is the GPU running out of memory: PyTorch's allocator's error, or CUDA's own ("Triton Error
    [CUDA]: out of memory", a library's "CUDA out of memory"), raised outside the allocator."""
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    words = str(exc)
    return isinstance(exc, RuntimeError) and "CUDA" in words and "out of memory" in words


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
            _log.warning("autotuning %s: candidate %s skipped, its launch ran out of GPU memory", _kernel_name(self),
                         kwargs.get("config"))
            return [float("inf")] * 3  # never the fastest: the tuner takes another candidate

    Autotuner._bench = bench_or_skip


def _kernel_name(tuner) -> str:
    """The tuned kernel's name, through the decorators (heuristics) between the tuner and the jitted function."""
    fn = tuner
    while getattr(fn, "fn", None) is not None and not hasattr(fn, "__name__"):
        fn = fn.fn
    return getattr(fn, "__name__", type(tuner).__name__)
