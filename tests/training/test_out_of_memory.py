"""Running out of GPU memory, whoever says it: PyTorch's allocator or CUDA itself as a Triton launch reports it. An
autotuning candidate whose launch the card cannot hold is skipped, not the run's end (seen on an 80 GB H100: one of
FLA's candidates asked the driver for 7 GB of local memory); the allocator is capped where the plan says."""

import pytest
import torch
import triton
import triton.language as tl

from training import fitting
from training.out_of_memory import is_out_of_memory, tune_past_out_of_memory

TRITON_OOM = "Triton Error [CUDA]: out of memory"


@pytest.mark.parametrize("exc, expected", [
    (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB."), True),
    (RuntimeError(TRITON_OOM), True),
    (RuntimeError("CUDA error: out of memory"), True),
    (RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"), True),
    (RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"), True),
    (RuntimeError("NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled cuda error, NCCL version 2.27.3\n"
                  "ncclUnhandledCudaError: Call to CUDA function failed.\nLast error:\nCuda failure 'out of memory'"),
     True),
    (RuntimeError("CUDA_ERROR_OUT_OF_MEMORY"), True),
    (RuntimeError("CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasGemmEx`"), False),
    (RuntimeError("CUDA error: an illegal memory access was encountered"), False),
    (RuntimeError("the host ran out of memory reading the shard"), False),  # not the GPU's
    (ValueError(TRITON_OOM), False),
])
def test_it_knows_the_gpu_running_out_of_memory_whoever_says_it(exc, expected):
    assert is_out_of_memory(exc) is expected


def _refuse(words):
    def hook(nargs):
        raise RuntimeError(words)
    return hook


def _doubler(first_hook):
    """A kernel tuned over two candidates; the first one's launch fails as `first_hook` has it."""
    @triton.autotune(configs=[triton.Config({"BLOCK": 16}, pre_hook=first_hook), triton.Config({"BLOCK": 32})],
                     key=["n"], do_bench=lambda fn, quantiles: (fn(), [1.0, 1.0, 1.0])[1])
    @triton.jit
    def double(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)

    return double


def _run(kernel):
    x = torch.arange(100, dtype=torch.float32)
    y = torch.zeros_like(x)
    kernel[lambda meta: (triton.cdiv(100, meta["BLOCK"]),)](x, y, 100)
    return x, y


def test_a_candidate_the_card_cannot_launch_is_tuned_past(caplog):
    tune_past_out_of_memory()
    kernel = _doubler(_refuse(TRITON_OOM))
    with caplog.at_level("WARNING", logger="training.out_of_memory"):
        x, y = _run(kernel)
    assert torch.equal(y, 2 * x)
    assert kernel.best_config.kwargs == {"BLOCK": 32}
    # the run's log says which kernel lost which candidate, and why
    assert "autotuning double: candidate BLOCK: 16" in caplog.text and "ran out of GPU memory" in caplog.text


def test_any_other_failure_of_a_candidate_still_ends_the_run():
    tune_past_out_of_memory()
    with pytest.raises(RuntimeError, match="illegal memory access"):
        _run(_doubler(_refuse("CUDA error: an illegal memory access was encountered")))


def test_a_triton_whose_autotuner_changed_shape_runs_unguarded_not_broken(monkeypatch, caplog):
    from triton.runtime.autotuner import Autotuner

    monkeypatch.delattr(Autotuner, "_bench")
    tune_past_out_of_memory.__wrapped__()  # past the cache: as on a first call
    assert not hasattr(Autotuner, "_bench") and "no _bench" in caplog.text


def test_the_allocator_is_capped_at_what_the_plan_counts_usable(monkeypatch):
    set_to = []
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda index: type("Props", (), {"total_memory": 80 * 2**30})())
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction",
                        lambda fraction, index: set_to.append((fraction, index)))
    assert fitting.cap_allocator(torch.device("cuda", 1), 76.0) == pytest.approx(0.95)
    assert set_to == [(pytest.approx(0.95), 1)]
    assert fitting.cap_allocator(torch.device("cuda", 0), 90.0) == 1.0  # a budget over the card: no cap below it
    assert fitting.cap_allocator(torch.device("cpu"), 76.0) == 1.0 and len(set_to) == 2  # a CPU: nothing to cap
