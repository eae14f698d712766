"""The (dtype, tolerance, device) a kernel test runs in: fp32 and fp16 in Triton's interpreter on the CPU, bf16 on a
GPU (the interpreter's bf16 is not to be trusted)."""

import pytest
import torch

INTERPRETER_AND_GPU = [
    (torch.float32, 1e-5, "cpu"), (torch.float16, 4e-3, "cpu"),
    pytest.param(torch.bfloat16, 3e-2, "cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                                         reason="bf16 on the GPU")),
]
