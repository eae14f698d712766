"""A phase as it trains (`Phase`), and what the whole run shares with the optimizer step every phase goes through
(`Trainee`) (docs/training.md, "training/phase.py")."""

import dataclasses
import functools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch

from training import checkpoint, distributed, export_adapter, families, guards, moe_lora, rollout, router_load
from training import optimizers
from training import metric_fields, validation
from training.data import batch_indices, boundaries_width, collate, phase_items, read_records, split_records
from training.graphs import MicroStepGraphs, eager_micro_step
from training.losses import LOSSES, preference_means, sequence_logps
from training.packing import with_host_ends
from training.recipe import RunRecipe, load_reward

NORM_GROUPS = (*families.GROUPS, "other")  # "other": trainable parameters outside the family's groups
# Every record has every field; a phase kind's own and the held-out ones are None where the step has none.
NOT_THIS_KIND = {f.name: None for f in (*metric_fields.PHASE_KIND_FIELDS, *metric_fields.HELD_OUT_FIELDS)}


def lr_lambda(schedule, warmup_steps, total_steps, min_lr_ratio):
    def factor(step):
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        if schedule == "linear":
            return 1.0 - (1.0 - min_lr_ratio) * progress
        if schedule == "cosine":
            return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
        return 1.0

    return factor


def to_device(batch, device):
    return {k: v.to(device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}


def _kernel_path(model):
    """The experts' last kernel path, or None for a model whose experts are not ours (the benchmark's baseline)."""
    try:
        return moe_lora.kernels_of(model).last_path
    except ValueError:
        return None


class PhaseLoss(NamedTuple):
    """What a phase's micro-steps compute: its kind's loss with the phase's settings and context (tokenizer,
    device, GRPO reward), as the losses and the CUDA graphs take them (training/losses.py)."""

    fn: Callable
    settings: dict
    ctx: dict


@dataclass
class Trainee:
    """The model in training and what every phase's steps share: its trainable parameters by group
    (`train.parameter_groups`), its ranks, the CUDA graphs that replay its micro-steps (None:
    eager steps) and the gradient clipping (0: none)."""

    model: torch.nn.Module
    groups: dict
    ranks: distributed.OneRank | distributed.Ranks
    graphs: MicroStepGraphs | None = None
    max_grad_norm: float = 1.0
    router: router_load.RouterCounter | None = None  # the router's load, counted in every training forward
    optimizer: str = "adamw"  # what every phase steps with (memory_plan.OPTIMIZERS)

    @property
    def device(self):
        return self.ranks.device

    def optimizer_step(self, micro_batches, loss, optimizer, scheduler, check_guard=False):
        """One optimizer step over the micro-batches (gradient accumulation); returns the step's metrics.

        check_guard: run the step-1 routed-gradient guard (on every rank) after the backward, skipped while the
        batch carries no gradient signal by construction; the caller keeps asking until a step has signal."""
        model, groups, ranks, device = self.model, self.groups, self.ranks, self.device
        start = time.perf_counter()
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        loss_sum = torch.zeros((), device=device)
        tokens, signals, extras = 0, [], {}
        micro_step = self.graphs.run if self.graphs is not None else eager_micro_step
        for batch in micro_batches:
            value, stats = micro_step(model, loss.fn, batch, loss.settings, loss.ctx, 1.0 / len(micro_batches))
            loss_sum += value.float()
            tokens = tokens + stats["tokens"]  # a device tensor stays one: read below, not per micro-step
            signals.append(stats["signal"])
            for key, stat in stats.items():
                if key not in ("tokens", "signal"):
                    extras[key] = extras.get(key, 0.0) + stat / len(micro_batches)
        # Read on the host once every micro-step is enqueued: a read per micro-step would stall the host on each one.
        tokens = int(tokens)
        signal = any(bool(s) for s in signals)
        ranks.average_expert_grads()  # sums over every rank's tokens, where FSDP averaged the rest
        signal = ranks.any(signal)
        guard_checked = False
        if check_guard and signal:
            ranks.everywhere(lambda: guards.check_lora_grads(model))
            guard_checked = True
        norms = {group: ranks.grad_norm(groups.get(group, ())).to(device) for group in NORM_GROUPS}
        own = ranks.local_figures(groups)
        total_norm = torch.linalg.vector_norm(torch.stack(list(norms.values())))
        if self.max_grad_norm:
            coef = (self.max_grad_norm / (total_norm + 1e-6)).clamp(max=1.0)
            grads = [distributed.local(p.grad) for p in groups["trainable"] if p.grad is not None]
            torch._foreach_mul_(grads, coef.to(grads[0].device))
        lr = float(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
        if self.graphs is not None:
            self.graphs.zero_grads()  # in place: captured graphs accumulate into these tensors
        else:
            optimizer.zero_grad(set_to_none=True)
        b_norms = [distributed.local(p.detach()).float().norm() for p in groups["routed_b"]]
        b_zero = sum(1 for p in groups["routed_b"] if not bool(p.detach().ne(0).any()))
        record = {
            "loss": float(loss_sum) / len(micro_batches),
            "lr": lr,
            **{f"grad_norm_{group}": float(norm) for group, norm in norms.items()},
            "grad_norm_total": float(total_norm),
            "routed_b_norm": float(torch.linalg.vector_norm(torch.stack(b_norms))) if b_norms else 0.0,
            "routed_b_zero": b_zero,
            "routed_b_count": len(groups["routed_b"]),
            "tokens": tokens,
            "signal": signal,
            "guard_checked": guard_checked,
            "kernel_path": _kernel_path(model),
            **{key: float(value) for key, value in extras.items()},
        }
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            # What the process holds on the card (the allocator's reservations, CUDA-graph pools included: a replayed
            # graph's activations never show in the allocated figure), and within it what tensors use right now.
            record["gpu_mem_gib"] = round(torch.cuda.memory_reserved(device) / 2**30, 2)
            record["gpu_peak_gib"] = round(torch.cuda.max_memory_reserved(device) / 2**30, 2)
            record["gpu_allocated_gib"] = round(torch.cuda.memory_allocated(device) / 2**30, 2)
        else:
            record["gpu_mem_gib"] = record["gpu_peak_gib"] = record["gpu_allocated_gib"] = None
        record["step_s"] = time.perf_counter() - start
        record["tokens_per_s"] = tokens / record["step_s"]
        return ranks.totals({**record, **own})


@torch.no_grad()
def score_reference(model, kind, items, batch_size, pad_id, device):
    """Log-probs of every DPO pair (N, 2) or KTO completion (N,) under the adapter as the phase begins."""
    scores = []
    for start in range(0, len(items), batch_size):
        chunk = items[start:start + batch_size]
        logps = sequence_logps(model, to_device(collate(kind, chunk, pad_id), device)).float().cpu()
        scores.append(torch.stack(logps.split(len(chunk)), dim=-1) if kind == "dpo" else logps)
    return torch.cat(scores)


def format_line(record):
    mem = (f" mem {record['gpu_mem_gib']:.1f}/{record['gpu_peak_gib']:.1f} GiB held (tensors "
           f"{record['gpu_allocated_gib']:.1f})" if record["gpu_mem_gib"] is not None else "")
    return (
        f"{record['phase_name']} step {record['step']}/{record['steps']} loss {record['loss']:.4f} "
        f"lr {record['lr']:.2e} {record['step_s']:.2f}s {record['tokens_per_s']:,.0f} tok/s | grad routed "
        f"{record['grad_norm_routed']:.3g} attn {record['grad_norm_attention']:.3g} linear attn "
        f"{record['grad_norm_linear_attention']:.3g} shared {record['grad_norm_shared_expert']:.3g} total "
        f"{record['grad_norm_total']:.3g} | routed B norm {record['routed_b_norm']:.4g} zero "
        f"{record['routed_b_zero']}/{record['routed_b_count']} |{mem} experts {record['kernel_path']}"
        + held_out_line(record)
    )


def held_out_line(record) -> str:
    """The printed line's held-out figures, where the step validated."""
    shown = [f"{key[len('eval_'):]} {value:.4g}" for key, value in record.items()
             if key.startswith("eval_") and key != "eval_s" and isinstance(value, float)]
    return f" | held-out {' '.join(shown)} ({record['eval_s']:.2f}s)" if record.get("eval_s") is not None else ""


class Phase:
    """Phase `index` of a recipe: built with its data, optimizer and schedule, then `start`ed (or `restore`d from a
    checkpoint's trainer state) and stepped until `done`; each step's record goes to `sinks` and `out`, each
    checkpoint to `uploader` (a checkpoint.Uploader or sharded_checkpoint.ShardedUploader)."""

    def __init__(self, recipe: RunRecipe, index, trainee: Trainee, tokenizer, sinks, uploader, out=print):
        self.recipe, self.index, self.trainee, self.tokenizer = recipe, index, trainee, tokenizer
        self.spec = spec = recipe.phases[index]
        self.sinks, self.uploader, self.out = sinks, uploader, out
        records, held_out = read_records(spec.data, spec.kind), []  # type: list[dict], list[dict]
        if spec.eval_split:  # the same records on every resume: a hash of each record and the run's seed
            records, held_out = split_records(records, spec.eval_split, recipe.seed)
        elif spec.eval_data:
            held_out = read_records(spec.eval_data, spec.kind)
        self.items = phase_items(spec.kind, records, tokenizer, recipe.seq_len)
        self.eval_items = phase_items(spec.kind, held_out, tokenizer, recipe.seq_len) if held_out else []
        self.eval_reference = None  # DPO/KTO: the held-out items' log-probs under the phase's reference
        self.optimizer = optimizers.build(trainee.optimizer, trainee.groups["trainable"], lr=spec.lr,
                                          weight_decay=recipe.weight_decay, device=trainee.device)
        self.batch_size = recipe.batch_size * trainee.ranks.size  # each rank reads its slice
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(
            recipe.schedule, recipe.warmup_steps, spec.steps, recipe.min_lr_ratio))
        self.loss = PhaseLoss(LOSSES[spec.kind], dataclasses.asdict(spec), {
            "tokenizer": tokenizer, "device": trainee.device,
            "reward_fn": load_reward(spec.reward) if spec.kind == "grpo" else None})
        self.step, self.position, self.reference = 0, 0, None
        self.data_seed = recipe.seed * 1000 + index
        self.guard_pending = True  # at the first step of every phase, and of every resumed process
        graphed = trainee.graphs is not None
        # DPO/KTO rows padded to a few lengths only where graphs replay them; eager steps gain nothing from the
        # padding. The reference is scored as before (each chunk padded to its longest pair): the same log-probs.
        self.bucket_seq_len = recipe.seq_len if graphed else None
        # Packed rows' sample boundaries padded to one width for the phase: one shape, one graph.
        self.width = (boundaries_width(self.items, self.batch_size) if graphed and spec.kind in ("cpt", "sft")
                      else None)

    def start(self):
        """From its first step: a DPO/KTO phase scores its reference with the adapter as it stands."""
        self._reset_router()
        if self.spec.kind in ("dpo", "kto"):
            self.reference = score_reference(self.trainee.model, self.spec.kind, self.items, self.recipe.batch_size,
                                              self.tokenizer.pad_token_id, self.trainee.device)
            self.eval_reference = self._score_eval_reference()

    def _score_eval_reference(self):
        if not self.eval_items or self.spec.kind not in ("dpo", "kto"):
            return None
        return score_reference(self.trainee.model, self.spec.kind, self.eval_items, self.recipe.batch_size,
                               self.tokenizer.pad_token_id, self.trainee.device)

    def restore(self, state):
        """From a checkpoint's trainer state (`save`): optimizer, schedule, random state, step, data position."""
        optimizers.load_state_dict(self.optimizer, state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        checkpoint.set_rng_state(state["rng"])
        self.step, self.position, self.reference = state["step"], state["data_position"], state["reference"]
        # A checkpoint from before the held-out data was named holds none: scored now, with the adapter as restored.
        self.eval_reference = state.get("eval_reference")
        if self.eval_reference is None:
            self.eval_reference = self._score_eval_reference()
        self._reset_router()

    def _reset_router(self):
        if self.trainee.router is not None:
            self.trainee.router.reset()  # a phase's intervals count its own training forwards only

    def router_due(self):
        every = self.recipe.metrics.router_every
        return every > 0 and (self.step % every == 0 or self.done)

    @property
    def done(self):
        return self.step >= self.spec.steps

    def validation_due(self):
        """Every eval_every steps and at the phase's end, where the phase has held-out data."""
        every = self.spec.eval_every
        return bool(self.eval_items) and (self.done or (every > 0 and self.step % every == 0))

    def validate(self):
        """The held-out figures of the model as it stands (training/validation.py)."""
        return validation.validate(self.trainee.model, self.spec.kind, self.eval_items, settings=self.loss.settings,
                                   batch_size=self.recipe.batch_size, tokenizer=self.tokenizer,
                                   device=self.trainee.device, reference=self.eval_reference,
                                   reward_fn=self.loss.ctx["reward_fn"])

    def micro_batches(self):
        """The next step's micro-batches, this rank's slice of each, on the device."""
        kind, batches = self.spec.kind, []
        for _ in range(self.recipe.grad_accum):
            index = batch_indices(len(self.items), self.batch_size, self.position, self.data_seed)
            index = self.trainee.ranks.rank_slice(index)
            self.position += 1
            batch = with_host_ends(self.trainee.model, collate(kind, [self.items[i] for i in index],
                                                               self.tokenizer.pad_token_id, self.bucket_seq_len,
                                                               self.width))
            if kind == "dpo":
                batch["ref_logps"] = torch.cat([self.reference[index, 0], self.reference[index, 1]])
            elif kind == "kto":
                batch["ref_logps"] = self.reference[index]
            batches.append(to_device(batch, self.trainee.device))
        return batches

    def train_step(self):
        """One optimizer step; returns its record."""
        record = self.trainee.optimizer_step(self.micro_batches(), self.loss, self.optimizer, self.scheduler,
                                             check_guard=self.guard_pending)
        record = {**NOT_THIS_KIND, **preference_means(record)}
        self.guard_pending = self.guard_pending and not record["guard_checked"]
        self.step += 1
        if self.validation_due():
            record.update(self.validate())
        router = self.trainee.router
        # The one host read of the counts: every metrics.router_every steps and at the phase's end.
        record.update(router_load.summary(router.take(self.trainee.ranks)) if router is not None and self.router_due()
                      else router_load.NOT_READ)
        return {"phase": self.index, "phase_name": self.spec.name, "kind": self.spec.kind, "step": self.step,
                "steps": self.spec.steps, "time": time.time(), **record}

    def log(self, record):
        """To the metrics sinks and the printed line; a loss that is not finite stops the run."""
        for sink in self.sinks:
            sink.emit(record)
        self.out(format_line(record))
        if not math.isfinite(record["loss"]):
            raise FloatingPointError(f"{self.spec.name} step {self.step}: loss is {record['loss']}; stopping")

    def checkpoint_due(self):
        return self.step % self.spec.checkpoint_every == 0 or self.done

    def save(self):
        """A checkpoint of where the phase stands; the phase's final one also holds the adapter in vLLM's layout."""
        model, exports = self.trainee.model, ()
        if self.done:  # exported from the files just saved
            exports = (functools.partial(export_adapter.write_vllm_export,
                                         architecture=type(model.get_base_model()).__name__),)
        self.uploader.save(model, {
            "phase_index": self.index, "phase_name": self.spec.name, "step": self.step,
            "data_position": self.position, "optimizer": optimizers.state_dict(self.optimizer),
            "scheduler": self.scheduler.state_dict(), "rng": checkpoint.rng_state(), "reference": self.reference,
            "eval_reference": self.eval_reference,
        }, checkpoint.checkpoint_name(self.index, self.step), exports=exports)

    def finish(self):
        if self.spec.kind == "grpo":
            rollout.release(self.trainee.model)  # the rollouts' caches and graphs: the next phase trains in that memory
