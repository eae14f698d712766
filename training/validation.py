"""Validation on a phase's held-out records, in eval mode and without gradients: each kind's figures computed as its
training computes them, named `eval_*` in the metric record (docs/training.md, "training/validation.py")."""

import math
import time

import torch

from training.data import collate
from training.head_loss import next_token_losses
from training.losses import dpo_terms, generate, kto_terms, preference_means, rewards_of, sequence_logps
from training.packing import model_inputs, with_host_ends

LARGEST_LOSS_FOR_PERPLEXITY = 80.0  # exp(80) is about 5.5e34; a loss past it gives no perplexity worth drawing


def _to(batch, device):
    return {k: v.to(device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}


def _chunks(items, batch_size):
    return (items[start:start + batch_size] for start in range(0, len(items), batch_size))


def _causal_lm(model, kind, items, batch_size, pad_id, device) -> dict[str, float | None]:
    """CPT/SFT: the mean next-token loss over every held-out label token, on rows packed as training packs them."""
    total = torch.zeros((), device=device)
    count = torch.zeros((), device=device, dtype=torch.long)
    for chunk in _chunks(items, batch_size):
        batch = _to(with_host_ends(model, collate(kind, chunk, pad_id)), device)
        losses, mask = next_token_losses(model, model_inputs(model, batch), batch["labels"])
        total += losses.float().sum()
        count += mask.sum()
    loss = float(total) / max(int(count), 1)
    metrics: dict[str, float | None] = {"eval_loss": loss}
    if kind == "cpt":
        metrics["eval_perplexity"] = math.exp(loss) if loss <= LARGEST_LOSS_FOR_PERPLEXITY else None
    return metrics


def _preference(model, kind, items, reference, settings, batch_size, pad_id, device) -> dict[str, float | None]:
    """DPO/KTO: the phase's loss and TRL's reward metrics over every held-out pair or completion, against the
    reference scored at the phase's start."""
    logps = []
    for chunk in _chunks(items, batch_size):
        scored = sequence_logps(model, _to(collate(kind, chunk, pad_id), device)).float()
        logps.append(torch.stack(scored.split(len(chunk)), dim=-1) if kind == "dpo" else scored)
    logps = torch.cat(logps)
    reference = reference.to(logps)
    if kind == "dpo":  # (N, 2) columns chosen, rejected; the terms take rows [chosen; rejected]
        losses, metrics = dpo_terms(logps.t().reshape(-1), reference.t().reshape(-1), settings["beta"])
    else:
        desirable = torch.tensor([it["desirable"] for it in items], device=logps.device)
        losses, kl, sums = kto_terms(logps, reference, desirable, settings)
        metrics = preference_means({**sums, "kl": kl})
        metrics.pop("kl")
    figures: dict[str, float | None] = {"eval_loss": float(losses.mean())}
    figures.update({f"eval_{key}": None if value is None else float(value) for key, value in metrics.items()})
    return figures


def _grpo(model, items, settings, reward_fn, tokenizer, batch_size, device) -> dict:
    """GRPO: one greedy completion per held-out prompt (temperature 0, the phase's max_new_tokens), scored by the
    phase's reward function; the rewards' mean and spread over the prompts."""
    greedy = {**settings, "temperature": 0.0}
    rewards = []
    for chunk in _chunks(items, batch_size):
        _, _, completions, keep = generate(model, [it["prompt_ids"] for it in chunk], greedy, tokenizer, device)
        rewards.append(rewards_of(reward_fn, [it["record"] for it in chunk], completions, keep, tokenizer))
    rewards = torch.cat(rewards)
    spread = float(rewards.std()) if len(rewards) > 1 else 0.0
    return {"eval_reward_mean": float(rewards.mean()), "eval_reward_std": spread}


def validate(model, kind, items, *, settings, batch_size, tokenizer, device, reference=None, reward_fn=None) -> dict:
    """The phase's held-out figures and the seconds they took (`eval_s`); the model is back in training mode after.
    Every rank runs it whole (its forwards are collective under FSDP and expert parallelism), so all agree."""
    started = time.perf_counter()
    pad_id = tokenizer.pad_token_id
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            if kind in ("cpt", "sft"):
                figures = _causal_lm(model, kind, items, batch_size, pad_id, device)
            elif kind in ("dpo", "kto"):
                figures = _preference(model, kind, items, reference, settings, batch_size, pad_id, device)
            elif kind == "grpo":
                figures = _grpo(model, items, settings, reward_fn, tokenizer, batch_size, device)
            else:
                raise ValueError(f"no validation for a {kind} phase")
    finally:
        model.train(was_training)
    # A figure that is not finite is left out (the dashboard takes finite numbers only): the point keeps the rest.
    figures = {key: value if value is None or math.isfinite(value) else None for key, value in figures.items()}
    return {**figures, "eval_s": time.perf_counter() - started}
