"""The head and next-token loss in one pass over the vocabulary, a chunk of tokens at a time, never holding the whole
logits (docs/training.md, "training/head_loss.py")."""

import torch

from training.data import IGNORE
from training.kernels.cross_entropy import cross_entropy_rows_

CHUNK_TOKENS = 1024


def _rows_torch(logits, target):
    """(losses, d logits in the logits' type) of one chunk, in PyTorch (float32 passes over the chunk)."""
    logits = logits.float()
    valid = target != IGNORE
    safe = torch.where(valid, target, 0)
    lse = torch.logsumexp(logits, dim=-1)
    picked = logits.gather(1, safe.unsqueeze(1)).squeeze(1)
    probs = torch.exp(logits - lse.unsqueeze(1))  # softmax, in place of the logits' memory
    probs.scatter_add_(1, safe.unsqueeze(1), torch.where(valid, -1.0, 0.0).unsqueeze(1))
    probs.mul_(valid.unsqueeze(1))
    return torch.where(valid, lse - picked, 0.0), probs


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk, rows_kernel):
        hidden = hidden.contiguous()
        losses = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
        grads = torch.empty(hidden.shape, dtype=hidden.dtype, device=hidden.device)
        for start in range(0, hidden.shape[0], chunk):
            rows = slice(start, start + chunk)
            logits = hidden[rows] @ weight.t()
            if rows_kernel:  # the gradient written over the logits, in their type
                losses[rows] = cross_entropy_rows_(logits, targets[rows], IGNORE)
                dlogits = logits
            else:
                losses[rows], dlogits = _rows_torch(logits, targets[rows])
            torch.mm(dlogits.to(hidden.dtype), weight, out=grads[rows])
        ctx.save_for_backward(grads)
        return losses

    @staticmethod
    def backward(ctx, grad_losses):
        (grads,) = ctx.saved_tensors
        return grads * grad_losses.unsqueeze(1).to(grads.dtype), None, None, None, None


def linear_cross_entropy(hidden, weight, targets, chunk: int = CHUNK_TOKENS, rows_kernel: bool | None = None):
    """Per-token next-token loss (float32, 0 where the target is IGNORE) of `hidden` (N, H) through the frozen head
    `weight` (V, H) against `targets` (N,), with the gradient for `hidden` only. rows_kernel: each chunk's loss and
    gradient in one Triton kernel (training/kernels/cross_entropy.py) or in PyTorch; None: the kernel on a GPU."""
    if weight.requires_grad:
        raise ValueError("the fused head loss is for a frozen head; train the head through the plain path")
    if rows_kernel is None:
        rows_kernel = hidden.is_cuda
    return _LinearCrossEntropy.apply(hidden, weight, targets, chunk, rows_kernel)


def head_and_body(model):
    """(the decoder body, the frozen LM head) of a causal LM, peft-wrapped or not, or None where the model is not
    built that way (then the caller takes the logits path)."""
    causal = model.get_base_model() if hasattr(model, "get_base_model") else model
    body, head = getattr(causal, "model", None), getattr(causal, "lm_head", None)
    if body is None or not isinstance(head, torch.nn.Linear) or head.bias is not None or head.weight.requires_grad:
        return None
    if _sharded(head.weight):
        return None  # FSDP gathers the parameters in its root module's forward, which calling the body would skip
    if getattr(causal.config, "final_logit_softcapping", None) or getattr(causal, "logit_scale", None) is not None:
        return None  # a head that does more than one matmul
    return body, head


def next_token_losses(model, inputs: dict, labels):
    """(per-token loss (B, L-1) in float32, the mask of tokens in the loss), through the fused head where the model
    allows it, else through its logits."""
    targets = labels[:, 1:]
    parts = head_and_body(model)
    if parts is None:
        logits = model(**inputs).logits[:, :-1]
        flat = logits.reshape(-1, logits.shape[-1]).float()
        losses = torch.nn.functional.cross_entropy(flat, targets.reshape(-1), ignore_index=IGNORE, reduction="none")
        return losses.view_as(targets), targets != IGNORE
    body, head = parts
    hidden = body(**inputs).last_hidden_state[:, :-1]
    losses = linear_cross_entropy(hidden.reshape(-1, hidden.shape[-1]), head.weight, targets.reshape(-1))
    return losses.view_as(targets), targets != IGNORE


def _sharded(weight) -> bool:
    """Whether FSDP2 holds the weight as a shard (a DTensor), gathered only by its root module's forward hooks."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # a torch without distributed tensors
        return False
    return isinstance(weight, DTensor)
