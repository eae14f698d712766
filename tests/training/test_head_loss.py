"""The fused head loss is the plain path's loss and gradient, without the whole logits."""

import pytest
import torch

from training.data import IGNORE
from training.head_loss import linear_cross_entropy, next_token_losses


def _plain(hidden, weight, targets):
    logits = (hidden @ weight.t()).float()
    return torch.nn.functional.cross_entropy(logits, targets, ignore_index=IGNORE, reduction="none")


@pytest.mark.parametrize("rows_kernel", [False, True])  # PyTorch's passes, the Triton kernel (interpreted here)
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.float16, 2e-3)])
@pytest.mark.parametrize("chunk, vocab", [(3, 50), (1024, 50), (4, 700)])  # 700: several column blocks and a tail
def test_it_gives_the_plain_paths_losses_and_gradients(dtype, tol, chunk, vocab, rows_kernel):
    torch.manual_seed(0)
    hidden = torch.randn(10, 16, dtype=dtype, requires_grad=True)
    weight = torch.randn(vocab, 16, dtype=dtype)
    targets = torch.randint(0, vocab, (10,))
    targets[[2, 7]] = IGNORE
    targets[0] = vocab - 1  # the last column
    upstream = torch.rand(10)
    fused = linear_cross_entropy(hidden, weight, targets, chunk=chunk, rows_kernel=rows_kernel)
    (fused * upstream).sum().backward()
    fused_grad, hidden.grad = hidden.grad, None
    plain = _plain(hidden, weight, targets)
    (plain * upstream).sum().backward()
    assert torch.allclose(fused, plain, atol=tol, rtol=tol)
    assert fused[2] == 0 and fused[7] == 0 and torch.all(fused_grad[[2, 7]] == 0)
    assert torch.allclose(fused_grad.float(), hidden.grad.float(), atol=tol, rtol=tol)


def test_it_refuses_a_head_that_trains():
    with pytest.raises(ValueError, match="frozen head"):
        linear_cross_entropy(torch.randn(2, 4), torch.randn(5, 4, requires_grad=True), torch.tensor([1, 2]))


def test_a_models_loss_is_the_logits_paths():
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(0)
    config = Qwen3MoeConfig(vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                            num_experts=4, num_experts_per_tok=2, max_position_embeddings=64)
    model = Qwen3MoeForCausalLM(config)
    model.lm_head.weight.requires_grad_(False)
    input_ids = torch.randint(0, 64, (2, 12))
    labels = input_ids.clone()
    labels[0, :4] = IGNORE
    fused, mask = next_token_losses(model, {"input_ids": input_ids}, labels)
    fused.sum().backward()
    fused_grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad()
    logits = model(input_ids=input_ids).logits[:, :-1]
    plain = torch.nn.functional.cross_entropy(logits.reshape(-1, 64).float(), labels[:, 1:].reshape(-1),
                                              ignore_index=IGNORE, reduction="none").view_as(fused)
    plain.sum().backward()
    plain_grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert torch.allclose(fused, plain, atol=1e-5) and mask.sum() == 22 - 3
    assert len(fused_grads) == len(plain_grads) > 0
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(fused_grads, plain_grads, strict=True))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="bf16 on the GPU")
def test_it_gives_the_plain_paths_losses_and_gradients_in_bf16_on_the_gpu():
    torch.manual_seed(0)
    hidden = torch.randn(3000, 2048, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    weight = torch.randn(151936, 2048, dtype=torch.bfloat16, device="cuda") * 0.02
    targets = torch.randint(0, 151936, (3000,), device="cuda")
    targets[::7] = IGNORE
    fused = linear_cross_entropy(hidden, weight, targets)
    fused.sum().backward()
    fused_grad, hidden.grad = hidden.grad, None
    plain = _plain(hidden, weight, targets)
    plain.sum().backward()
    assert torch.allclose(fused, plain, atol=1e-3, rtol=1e-3)
    assert torch.allclose(fused_grad.float(), hidden.grad.float(), atol=1e-3, rtol=1e-2)


def test_the_rows_kernel_is_stable_for_large_logits_and_writes_the_gradient_in_place():
    from training.kernels.cross_entropy import cross_entropy_rows_

    torch.manual_seed(1)
    logits = torch.randn(6, 300) * 200  # exp of these overflows float32 without the max taken out
    targets = torch.tensor([0, 299, 5, IGNORE, 17, 150])
    want = torch.nn.functional.cross_entropy(logits, targets, ignore_index=IGNORE, reduction="none")
    want_grad = torch.softmax(logits, -1) - torch.nn.functional.one_hot(targets.clamp(min=0), 300)
    want_grad[3] = 0
    got = logits.clone()
    losses = cross_entropy_rows_(got, targets, IGNORE)
    torch.testing.assert_close(losses, want, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(got, want_grad, rtol=1e-5, atol=1e-6)
    assert torch.isfinite(losses).all() and losses[3] == 0
