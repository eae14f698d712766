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


def dpo_terms(logps, ref, beta):
    """(per-pair DPO losses, the preference metrics as TRL's DPOTrainer logs them) of rows [chosen; rejected]: a
    completion's reward is beta times its log-prob's gain over the reference."""
    n = logps.shape[0] // 2
    ratio = logps - ref.to(logps)
    chosen, rejected = beta * ratio[:n].detach(), beta * ratio[n:].detach()
    losses = -F.logsigmoid(beta * (ratio[:n] - ratio[n:]))
    return losses, {"rewards_chosen": chosen.mean(), "rewards_rejected": rejected.mean(),
                    "rewards_accuracy": (chosen > rejected).float().mean(),
                    "rewards_margin": (chosen - rejected).mean()}


def dpo_loss(model, batch, phase, ctx):
    losses, metrics = dpo_terms(sequence_logps(model, batch), batch["ref_logps"], phase["beta"])
    return losses.mean(), {"tokens": batch["attention_mask"].sum(), "signal": True, **metrics}


def kto_terms(logps, ref, desirable, phase):
    """(per-completion KTO losses, the KL estimate, device sums that `preference_means` turns into TRL's KTO metrics:
    the desirable and undesirable completions' rewards, summed and counted apart since a batch may lack either)."""
    ratio = logps - ref.to(logps)
    kl = ratio.detach().mean().clamp(min=0)
    beta, desirable = phase["beta"], desirable.to(logps.device)
    losses = torch.where(
        desirable,
        phase["desirable_weight"] * (1 - torch.sigmoid(beta * (ratio - kl))),
        phase["undesirable_weight"] * (1 - torch.sigmoid(beta * (kl - ratio))),
    )
    rewards = beta * ratio.detach()
    sums = {"rewards_chosen_sum": (rewards * desirable).sum(), "chosen_count": desirable.float().sum(),
            "rewards_rejected_sum": (rewards * ~desirable).sum(), "rejected_count": (~desirable).float().sum()}
    return losses, kl, sums


def kto_loss(model, batch, phase, ctx):
    losses, kl, sums = kto_terms(sequence_logps(model, batch), batch["ref_logps"], batch["desirable"], phase)
    return losses.mean(), {"tokens": batch["attention_mask"].sum(), "signal": True, "kl": kl, **sums}


def preference_means(stats: dict) -> dict:
    """KTO's summed rewards as means (a step's micro-batches averaged both sums and counts alike, so their ratio
    holds) and their margin; None where the step had no completion of that label. Other records pass unchanged."""
    if "chosen_count" not in stats:
        return stats
    stats = dict(stats)
    means = {}
    for side, count in (("rewards_chosen", "chosen_count"), ("rewards_rejected", "rejected_count")):
        total, n = float(stats.pop(f"{side}_sum")), float(stats.pop(count))
        means[side] = total / n if n > 0 else None
    chosen, rejected = means["rewards_chosen"], means["rewards_rejected"]
    means["rewards_margin"] = chosen - rejected if chosen is not None and rejected is not None else None
    return {**stats, **means}


@torch.no_grad()
def generate(model, prompts, phase, tokenizer, device):
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
    prompt_ids, prompt_mask, completions, keep = generate(model, prompts, phase, tokenizer, ctx["device"])
    rewards = rewards_of(ctx["reward_fn"], records, completions, keep, tokenizer)
    advantages, figures = group_figures(rewards, group, keep)
    input_ids = torch.cat([prompt_ids, completions], dim=1)
    attention_mask = torch.cat([prompt_mask, keep.long()], dim=1)
    labels = torch.cat([torch.full_like(prompt_ids, IGNORE), completions.masked_fill(~keep, IGNORE)], dim=1)
    logps, mask = token_logps(model, input_ids, attention_mask, labels, padding="left")  # prompts left-padded
    ratio = torch.exp(logps - logps.detach())  # 1 in value; its gradient is that of log pi
    advantages = advantages.to(logps.device).unsqueeze(-1)
    loss = -(ratio * advantages * mask).sum() / mask.sum().clamp(min=1)
    stats = {"tokens": int(attention_mask.sum()), "signal": bool(advantages.abs().sum() > 0), **figures}
    kl = reference_kl(model, input_ids, attention_mask, labels, logps.detach(), mask)
    if kl is not None:
        stats["kl"] = kl
    return loss, stats


def group_figures(rewards, group: int, keep) -> tuple[torch.Tensor, dict]:
    """(each completion's advantage, TRL's GRPO metrics) of rewards (G * group,) and the completions' kept tokens:
    the reward's mean, its spread within a group averaged over the groups, the share of groups whose rewards do not
    vary (no advantage: nothing is learnt from them), the completions' mean length in tokens."""
    grouped = rewards.view(-1, group)
    spread = grouped.std(-1)
    advantages = ((grouped - grouped.mean(-1, keepdim=True)) / (spread.unsqueeze(-1) + 1e-4)).view(-1)
    return advantages, {"reward_mean": float(rewards.mean()), "reward_std": float(spread.mean()),
                        "zero_spread_groups": float((spread == 0).float().mean()),
                        "completion_length": float(keep.sum(-1).float().mean())}


def rewards_of(reward_fn, records, completions, keep, tokenizer) -> torch.Tensor:
    """The phase's reward function on each decoded completion (its kept tokens), as a float tensor."""
    return torch.tensor([
        float(reward_fn(record.get("prompt"), tokenizer.decode(c[k].tolist(), skip_special_tokens=True), record))
        for record, c, k in zip(records, completions, keep, strict=True)
    ])


@torch.no_grad()
def reference_kl(model, input_ids, attention_mask, labels, logps, mask) -> float | None:
    """The policy's KL to the reference, the model with its adapter off, over the completions' tokens: TRL's
    estimator exp(ref - logp) - (ref - logp) - 1, averaged over every completion token; None for a model that is
    not a peft model (no adapter to turn off)."""
    if not hasattr(model, "disable_adapter"):
        return None
    with model.disable_adapter():
        ref, _ = token_logps(model, input_ids, attention_mask, labels, padding="left")
    return kl_estimate(ref, logps, mask)


def kl_estimate(ref_logps, logps, mask) -> float:
    """Mean over the masked tokens of exp(ref - logp) - (ref - logp) - 1 (TRL's GRPO; never below 0)."""
    delta = (ref_logps - logps).double()  # float32 rounding would take a near-zero KL below 0
    per_token = (torch.exp(delta) - delta - 1).clamp(min=0) * mask
    return float(per_token.sum() / mask.sum().clamp(min=1))


LOSSES = {"cpt": causal_lm_loss, "sft": causal_lm_loss, "dpo": dpo_loss, "kto": kto_loss, "grpo": grpo_loss}
