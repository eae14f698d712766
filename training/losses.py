"""The five phase losses: each takes (model, batch, phase, ctx) and returns (loss, stats); the training loop owns the
rest (docs/training.md, "training/losses.py")."""

import torch
import torch.nn.functional as F

from training.attention import uses_packed_attention
from training.data import IGNORE
from training.head_loss import next_token_losses
from training.packing import model_inputs
from training.rollout import sample


def token_logps(model, input_ids, attention_mask, labels, padding=None):
    """(per-token log-prob of the next label (B, L-1), mask of tokens in the loss), for right- or left-padded rows
    (docs/training.md, "training/losses.py")."""
    if padding is not None and uses_packed_attention(model):
        if padding == "left":
            input_ids, labels = left_aligned(attention_mask, input_ids, labels)
        batch = {"input_ids": input_ids}
    else:
        batch = {"input_ids": input_ids, "attention_mask": attention_mask}
    losses, mask = next_token_losses(model, model_inputs(model, batch), labels)
    return -losses * mask, mask


def left_aligned(attention_mask, *rows):
    """Each of `rows` (B, L) with every row turned left by its count of leading zeros in `attention_mask`: the
    leading padding moves to the end of the row, on the device, with no host sync."""
    length = attention_mask.shape[1]
    leading = (attention_mask == 0).cumprod(-1).sum(-1, keepdim=True)
    columns = (torch.arange(length, device=attention_mask.device) + leading) % length
    return tuple(row.gather(1, columns) for row in rows)


def sequence_logps(model, batch):
    """Summed log-probs of the labels of DPO/KTO rows (right-padded: training/data.py pad_pairs)."""
    logps, _ = token_logps(model, batch["input_ids"], batch["attention_mask"], batch["labels"], padding="right")
    return logps.sum(-1)


def causal_lm_loss(model, batch, phase, ctx):
    """CPT and SFT: mean next-token cross-entropy over label tokens (SFT labels cover assistant turns only); the
    samples packed in a row are kept apart (training/packing.py)."""
    losses, mask = next_token_losses(model, model_inputs(model, batch), batch["labels"])
    count = mask.sum()  # a tensor: no host sync per micro-batch
    return losses.sum() / count.clamp(min=1), {"tokens": batch["input_ids"].numel(), "signal": count > 0}


def dpo_loss(model, batch, phase, ctx):
    logps = sequence_logps(model, batch)
    ref = batch["ref_logps"].to(logps)
    n = logps.shape[0] // 2
    margin = (logps[:n] - ref[:n]) - (logps[n:] - ref[n:])
    loss = -F.logsigmoid(phase["beta"] * margin).mean()
    return loss, {"tokens": batch["attention_mask"].sum(), "signal": True,
                  "dpo_accuracy": (margin.detach() > 0).float().mean(), "dpo_margin": margin.detach().mean()}


def kto_loss(model, batch, phase, ctx):
    logps = sequence_logps(model, batch)
    ratio = logps - batch["ref_logps"].to(logps)
    kl = ratio.detach().mean().clamp(min=0)
    beta, desirable = phase["beta"], batch["desirable"].to(logps.device)
    losses = torch.where(
        desirable,
        phase["desirable_weight"] * (1 - torch.sigmoid(beta * (ratio - kl))),
        phase["undesirable_weight"] * (1 - torch.sigmoid(beta * (kl - ratio))),
    )
    return losses.mean(), {"tokens": batch["attention_mask"].sum(), "signal": True, "kto_kl": kl}


@torch.no_grad()
def _generate(model, prompts, phase, tokenizer, device):
    width = max(len(p) for p in prompts)
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
    attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    completions = sample(model, input_ids, attention_mask, phase["max_new_tokens"], phase["temperature"],
                         tokenizer.eos_token_id, pad)
    # A completion ends at its first eos (kept, so the model learns to stop); what follows is padding.
    ended = (completions == tokenizer.eos_token_id).long().cumsum(-1)
    keep = (ended == 0) | ((ended == 1) & (completions == tokenizer.eos_token_id))
    return input_ids, attention_mask, completions, keep


def grpo_loss(model, batch, phase, ctx):
    tokenizer, group = ctx["tokenizer"], phase["num_generations"]
    prompts = [p for p in batch["prompts"] for _ in range(group)]
    records = [r for r in batch["records"] for _ in range(group)]
    prompt_ids, prompt_mask, completions, keep = _generate(model, prompts, phase, tokenizer, ctx["device"])
    rewards = torch.tensor([
        float(ctx["reward_fn"](record.get("prompt"), tokenizer.decode(c[k].tolist(), skip_special_tokens=True), record))
        for record, c, k in zip(records, completions, keep, strict=True)
    ])
    grouped = rewards.view(-1, group)
    advantages = ((grouped - grouped.mean(-1, keepdim=True)) / (grouped.std(-1, keepdim=True) + 1e-4)).view(-1)
    input_ids = torch.cat([prompt_ids, completions], dim=1)
    attention_mask = torch.cat([prompt_mask, keep.long()], dim=1)
    labels = torch.cat([torch.full_like(prompt_ids, IGNORE), completions.masked_fill(~keep, IGNORE)], dim=1)
    logps, mask = token_logps(model, input_ids, attention_mask, labels, padding="left")  # prompts left-padded
    ratio = torch.exp(logps - logps.detach())  # 1 in value; its gradient is that of log pi
    advantages = advantages.to(logps.device).unsqueeze(-1)
    loss = -(ratio * advantages * mask).sum() / mask.sum().clamp(min=1)
    return loss, {"tokens": int(attention_mask.sum()), "signal": bool(advantages.abs().sum() > 0),
                  "reward": float(rewards.mean()), "completion_tokens": int(keep.sum())}


LOSSES = {"cpt": causal_lm_loss, "sft": causal_lm_loss, "dpo": dpo_loss, "kto": kto_loss, "grpo": grpo_loss}
