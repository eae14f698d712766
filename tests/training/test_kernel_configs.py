"""Kernel configs fit the device's shared memory: on a faked sm_120 card (about 99 KB a program) every config the
autotuner may pick fits, and Hopper (227 KB) keeps the configs chosen on an H200."""

import pytest
import torch

from training.kernels import _config, grouped_gemm, grouped_weight_grad, swiglu

SM_120_BYTES, HOPPER_BYTES = 101376, 232448


def _gpu_configs(monkeypatch, build):
    """The configs a GPU gets (the interpreter is given one small config instead)."""
    monkeypatch.setattr(_config, "interpreting", lambda: False)
    monkeypatch.setattr(grouped_gemm, "interpreting", lambda: False)
    return build()


def _bf16(*shape):
    return torch.empty(shape, dtype=torch.bfloat16)


def _cases(monkeypatch, rank=32):
    """(kernel, configs, prune, estimate, named args, launch kwargs) of every autotuned kernel with tiles in shared
    memory, for 30B-block shapes in bf16 with float32 LoRA factors (as peft keeps them)."""
    gemm_args = {"x_ptr": _bf16(4096, 2048), "y_ptr": _bf16(4096, 1536), "z_ptr": _bf16(4096, rank),
                 "l2_ptr": torch.empty(128, 1536, rank), "N": 1536}
    narrow_args = {**gemm_args, "N": rank}
    lora = {"HAS_LORA": True, "BLOCK_R": rank}
    wide = _gpu_configs(monkeypatch, lambda: grouped_gemm._configs(grouped_gemm._WIDE + grouped_gemm._NARROW))
    tma = _gpu_configs(monkeypatch, lambda: grouped_gemm._configs(grouped_gemm._TMA, FLATTEN=(True, False)))
    grad_args = {"p_ptr": _bf16(4096, rank), "q_ptr": _bf16(4096, 2048)}
    swiglu_args = {"gu_ptr": _bf16(4096, 1536)}
    return [
        ("gemm wide", wide, grouped_gemm._prune_pointer, grouped_gemm.shared_bytes, gemm_args, lora),
        ("gemm narrow", wide, grouped_gemm._prune_pointer, grouped_gemm.shared_bytes, narrow_args, {}),
        ("gemm tma", tma, grouped_gemm._prune_tma, grouped_gemm.shared_bytes, gemm_args, lora),
        ("weight grad", _gpu_configs(monkeypatch, grouped_weight_grad._configs), grouped_weight_grad._prune,
         grouped_weight_grad.shared_bytes, grad_args, {}),
        ("swiglu", _gpu_configs(monkeypatch, swiglu._configs), swiglu._prune, swiglu.shared_bytes, swiglu_args,
         {"BLOCK_R": rank}),
    ]


def test_on_a_small_shared_memory_card_every_config_that_may_be_picked_fits(monkeypatch):
    monkeypatch.setattr(_config, "shared_memory_limit", lambda device: SM_120_BYTES)
    for name, configs, prune, estimate, args, kwargs in _cases(monkeypatch):
        over = [c for c in configs if estimate(c, c.num_stages, args, kwargs) > SM_120_BYTES]
        chosen = prune(configs, args, **kwargs)
        assert chosen, name
        for config in chosen:
            assert estimate(config, config.num_stages, args, kwargs) <= SM_120_BYTES, (name, config)
        if name == "gemm tma":
            assert over, "the H200 configs must not all fit 99 KB, or this test shows nothing"
            assert {c.kwargs["BLOCK_N"] for c in chosen} >= {256}  # the same tiles, with fewer stages


def test_hopper_keeps_the_configs_chosen_on_an_h200(monkeypatch):
    monkeypatch.setattr(_config, "shared_memory_limit", lambda device: HOPPER_BYTES)
    for name, configs, prune, _, args, kwargs in _cases(monkeypatch):
        expected = grouped_gemm._by_width(configs, args) if name.startswith("gemm") and "tma" not in name else configs
        assert prune(configs, args, **kwargs) == expected, name


def test_a_device_where_nothing_fits_is_refused_with_the_reason(monkeypatch):
    monkeypatch.setattr(_config, "shared_memory_limit", lambda device: 1024)
    _, configs, prune, _, args, kwargs = _cases(monkeypatch)[2]
    with pytest.raises(ValueError, match="1024 bytes of shared memory"):
        prune(configs, args, **kwargs)


def test_the_cpu_has_no_shared_memory_limit():
    assert _config.shared_memory_limit(torch.device("cpu")) is None
