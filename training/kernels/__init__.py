"""Triton kernels of the MoE-LoRA experts backend, one kernel per file with its launch wrapper beside it."""
