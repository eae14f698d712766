"""The MoE-LoRA trainer: `python -m training.train --recipe recipe.yaml`.

Read top to bottom: build the model (or a random one from a config), put LoRA on attention and routed experts, run
the start-up guards, resume from the newest complete checkpoint if there is one, then run the recipe's phases in
order through one loop. Every phase (CPT, SFT, DPO, KTO, GRPO) goes through `optimizer_step`, so each gets the same
step-1 routed-gradient guard, the same clipping and the same metrics. Started again with the same recipe after a
kill, it continues from the last complete checkpoint.
"""

import argparse
import functools
import logging
import math
import os
import signal
import sys
import threading
import time
from pathlib import Path

import torch

from training import (checkpoint, distributed, export_adapter, families, guards, model_source, moe_lora, rollout,
                      sharded_checkpoint)
from training.data import (batch_indices, boundaries_width, collate, length_buckets, load_phase_data,
                           load_tokenizer)
from training.graphs import MicroStepGraphs, eager_micro_step
from training.lora import attach_lora, module_lora_parameters, routed_lora_parameters
from training.losses import LOSSES, sequence_logps
from training.metrics import open_sinks
from training.packing import with_host_ends
from training.recipe import RecipeError, load_recipe, load_reward

_log = logging.getLogger("training")


def checkpoint_class(config):
    """The class a checkpoint was saved from (its config's `architectures`), so that the adapter's keys are the
    checkpoint's own: the Qwen3.5/3.6-MoE checkpoints are the multimodal `Qwen3_5MoeForConditionalGeneration`, text
    under `model.language_model` (only the text decoder gets LoRA, training/families.py). A causal LM otherwise."""
    import transformers

    for name in getattr(config, "architectures", None) or []:
        cls = getattr(transformers, name, None)
        if cls is not None:
            return cls
    return transformers.AutoModelForCausalLM


def build_model(model_recipe, device):
    from transformers import AutoConfig, AutoModelForCausalLM

    dtype = getattr(torch, model_recipe["dtype"])
    if "config" in model_recipe:
        fields = dict(model_recipe["config"])
        config = AutoConfig.for_model(fields.pop("model_type"), **fields)
        torch.manual_seed(model_recipe["seed"])
        with torch.device(device):
            return AutoModelForCausalLM.from_config(config, dtype=dtype)
    path, revision = model_recipe["path"], model_recipe.get("revision")
    if model_source.kind_of(path) == "s3":  # the agent downloads it and hands the trainer the folder instead
        raise RecipeError(f"model.path {path}: an s3:// model is read from its downloaded folder; run the trainer "
                          "through the on-box agent (python -m training.agent) or give that folder")
    config = AutoConfig.from_pretrained(path, revision=revision)
    if torch.device(device).type == "meta":  # its shape only: the weights come from another rank
        with torch.device("meta"):
            return checkpoint_class(config)._from_config(config, dtype=dtype)
    return checkpoint_class(config).from_pretrained(path, revision=revision, dtype=dtype, device_map=device)


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


NORM_GROUPS = (*families.GROUPS, "other")  # "other": trainable parameters outside the family's groups


def parameter_groups(model):
    """The trainable parameters, and apart (for the metrics): each group of training/families.py (the routed
    experts never with the shared expert), what falls in none of them, and the routed LoRA B."""
    routed = routed_lora_parameters(model)
    trainable = [p for p in model.parameters() if p.requires_grad]
    trainable_ids = {id(p) for p in trainable}
    members = {families.ROUTED: list(routed.values())}
    for group, params in module_lora_parameters(model).items():
        members.setdefault(group, []).extend(params.values())
    groups = {"trainable": trainable, "routed_b": [p for n, p in routed.items() if ".lora_B." in n]}
    grouped = set()
    for group in families.GROUPS:
        groups[group] = [p for p in members.get(group, []) if id(p) in trainable_ids]
        grouped.update(id(p) for p in groups[group])
    groups["other"] = [p for p in trainable if id(p) not in grouped]
    return groups


def _norm(params, ranks=None):
    """The gradient norm of `params`; on several ranks, of every rank's part of them (FSDP shards, expert slices)."""
    grads = [distributed.local(p.grad) for p in params if p.grad is not None]
    squares = torch.stack([g.float().norm() ** 2 for g in grads]).sum() if grads else torch.zeros(())
    if ranks is not None:
        squares = ranks.sum(squares.to(ranks.device))
    return squares.sqrt()


def _kernel_path(model):
    """The experts' last kernel path, or None for a model whose experts are not ours (the benchmark's baseline)."""
    try:
        return moe_lora.kernels_of(model).last_path
    except ValueError:
        return None


def _to_device(batch, device):
    return {k: v.to(device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}


def optimizer_step(model, micro_batches, loss_fn, phase, ctx, optimizer, scheduler, groups, max_grad_norm,
                   check_guard=False, graphs=None, ranks=None):
    """One optimizer step over the micro-batches (gradient accumulation); returns the step's metrics.

    check_guard: run the step-1 routed-gradient guard after the backward (skipped while the batch carries no
    gradient signal by construction; the caller keeps asking until a step has signal).
    graphs: a MicroStepGraphs to run the micro-steps through (CUDA graphs), or None for plain eager steps.
    ranks: training.distributed.Ranks on several ranks (the guard on every rank, norms and the record over all)."""
    start = time.perf_counter()
    device = ctx["device"]
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    loss_sum = torch.zeros((), device=device)
    tokens, signals, extras = 0, [], {}
    micro_step = graphs.run if graphs is not None else eager_micro_step
    for batch in micro_batches:
        loss, stats = micro_step(model, loss_fn, batch, phase, ctx, 1.0 / len(micro_batches))
        loss_sum += loss.float()
        tokens = tokens + stats["tokens"]  # a device tensor stays one: read below, not per micro-step
        signals.append(stats["signal"])
        for key, value in stats.items():
            if key not in ("tokens", "signal"):
                extras[key] = extras.get(key, 0.0) + value / len(micro_batches)
    # Read on the host once every micro-step is enqueued: a read per micro-step would stall the host on each one.
    tokens = int(tokens)
    signal = any(bool(s) for s in signals)
    if ranks is not None:
        ranks.average_expert_grads()  # sums over every rank's tokens, where FSDP averaged the rest
        signal = ranks.any(signal)
    guard_checked = False
    if check_guard and signal:
        if ranks is not None:
            ranks.everywhere(lambda: guards.check_lora_grads(model))
        else:
            guards.check_lora_grads(model)
        guard_checked = True
    norms = {group: _norm(groups.get(group, ()), ranks).to(device) for group in NORM_GROUPS}
    routed_local = float(_norm(groups.get(families.ROUTED, ()))) if ranks is not None else None
    total_norm = torch.linalg.vector_norm(torch.stack(list(norms.values())))
    if max_grad_norm:
        coef = (max_grad_norm / (total_norm + 1e-6)).clamp(max=1.0)
        grads = [distributed.local(p.grad) for p in groups["trainable"] if p.grad is not None]
        torch._foreach_mul_(grads, coef.to(grads[0].device))
    lr = scheduler.get_last_lr()[0]
    optimizer.step()
    scheduler.step()
    if graphs is not None:
        graphs.zero_grads()  # in place: captured graphs accumulate into these tensors
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
    if ranks is not None:
        record = ranks.totals({**record, "grad_norm_routed_local": routed_local})
    return record


@torch.no_grad()
def score_reference(model, kind, items, batch_size, pad_id, device):
    """Log-probs of every DPO pair (N, 2) or KTO completion (N,) under the adapter as the phase begins."""
    scores = []
    for start in range(0, len(items), batch_size):
        chunk = items[start:start + batch_size]
        logps = sequence_logps(model, _to_device(collate(kind, chunk, pad_id), device)).float().cpu()
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
    )


def _quiet(line):
    pass


STOP = threading.Event()
STOPPED_EXIT = 75  # EX_TEMPFAIL: stopped on request with a checkpoint saved; started again, it resumes


class StopRequested(Exception):
    pass


def run_phase(recipe, phase_index, model, tokenizer, groups, uploader, sinks, device, resumed=None, out=print,
              graphs=None, ranks=None):
    phase = recipe["phases"][phase_index]
    kind = phase["kind"]
    items = load_phase_data(kind, phase["data"], tokenizer, recipe["seq_len"])
    optimizer = torch.optim.AdamW(groups["trainable"], lr=phase["lr"], weight_decay=recipe["weight_decay"],
                                  fused=device.type == "cuda")
    batch_size = recipe["batch_size"] * (ranks.size if ranks is not None else 1)  # each rank reads its slice
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(
        recipe["schedule"], recipe["warmup_steps"], phase["steps"], recipe["min_lr_ratio"]))
    ctx = {"tokenizer": tokenizer, "device": device,
           "reward_fn": load_reward(phase["reward"]) if kind == "grpo" else None}
    if resumed:
        optimizer.load_state_dict(resumed["optimizer"])
        scheduler.load_state_dict(resumed["scheduler"])
        checkpoint.set_rng_state(resumed["rng"])
        step, position, reference = resumed["step"], resumed["data_position"], resumed["reference"]
    else:
        step, position = 0, 0
        reference = None
        if kind in ("dpo", "kto"):
            reference = score_reference(model, kind, items, recipe["batch_size"], tokenizer.pad_token_id, device)
    data_seed = recipe["seed"] * 1000 + phase_index
    guard_pending = True  # at the first step of every phase, and of every resumed process
    loss_fn = LOSSES[kind]
    # DPO/KTO rows padded to a few lengths only where graphs replay them; eager steps gain nothing from the padding.
    # The reference is scored as before (each chunk padded to its longest pair): the same log-probs.
    bucket_seq_len = recipe["seq_len"] if graphs is not None else None
    # Packed rows' sample boundaries padded to one width for the phase: one shape, one graph.
    width = boundaries_width(items, batch_size) if graphs is not None and kind in ("cpt", "sft") else None
    while step < phase["steps"]:
        micro_batches = []
        for _ in range(recipe["grad_accum"]):
            index = batch_indices(len(items), batch_size, position, data_seed)
            if ranks is not None:
                index = ranks.rank_slice(index)
            position += 1
            batch = with_host_ends(model, collate(kind, [items[i] for i in index], tokenizer.pad_token_id,
                                                  bucket_seq_len, width))
            if kind == "dpo":
                batch["ref_logps"] = torch.cat([reference[index, 0], reference[index, 1]])
            elif kind == "kto":
                batch["ref_logps"] = reference[index]
            micro_batches.append(_to_device(batch, device))
        record = optimizer_step(model, micro_batches, loss_fn, phase, ctx, optimizer, scheduler, groups,
                                recipe["max_grad_norm"], check_guard=guard_pending, graphs=graphs, ranks=ranks)
        guard_pending = guard_pending and not record["guard_checked"]
        step += 1
        record = {"phase": phase_index, "phase_name": phase["name"], "kind": kind, "step": step,
                  "steps": phase["steps"], "time": time.time(), **record}
        for sink in sinks:
            sink.emit(record)
        out(format_line(record))
        if not math.isfinite(record["loss"]):
            raise FloatingPointError(f"{phase['name']} step {step}: loss is {record['loss']}; stopping")
        stopping = STOP.is_set()
        if step % phase["checkpoint_every"] == 0 or step == phase["steps"] or stopping:
            exports = ()
            if step == phase["steps"]:  # the phase's final adapter also in vLLM's layout, from the files just saved
                exports = (functools.partial(export_adapter.write_vllm_export,
                                             architecture=type(model.get_base_model()).__name__),)
            uploader.save(model, {
                "phase_index": phase_index, "phase_name": phase["name"], "step": step, "data_position": position,
                "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                "rng": checkpoint.rng_state(), "reference": reference,
            }, checkpoint.checkpoint_name(phase_index, step), exports=exports)
        if stopping:
            raise StopRequested(f"stopped on request at {phase['name']} step {step}, after saving a checkpoint")
    if kind == "grpo":
        rollout.release(model)  # the rollouts' caches and graphs: the next phase trains in that memory


def run(recipe, out=print):
    """Run (or continue) every phase of a validated recipe."""
    from peft import set_peft_model_state_dict

    ranks = distributed.join(recipe["gpus"])  # None for one process
    if ranks is not None and not ranks.main:
        out = _quiet  # rank 0 prints and writes the metrics for all
    device = ranks.device if ranks else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    base = build_model(recipe["model"], distributed.build_device(ranks, device))  # several ranks: sent layer by layer
    vocab_size = base.config.get_text_config().vocab_size
    tokenizer = load_tokenizer(recipe["model"], vocab_size)
    if recipe["gradient_checkpointing"]:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    lora = recipe["lora"]
    model = attach_lora(base, r=lora["r"], alpha=lora["alpha"], attention=lora["attention"], targets=lora["targets"])
    model.train()
    if ranks is not None:  # after LoRA, so that its factors are sharded and averaged (training/distributed.py)
        ranks.shard(model)  # runs the experts-forward guard on each layer, on every rank
    else:
        guards.check_experts_forward_is_ours(model)
    groups = parameter_groups(model)

    probe = torch.randint(3, vocab_size, (1, 16), generator=torch.Generator().manual_seed(0)).to(device)
    delta_check = functools.partial(guards.check_lora_delta_in_forward, model,
                                    lambda: model(input_ids=probe, labels=probe).loss)
    if ranks is not None:
        ranks.everywhere(delta_check)
    else:
        delta_check()

    store = checkpoint.open_store(recipe["checkpoint"])
    staging = recipe["checkpoint"]["staging"]
    if ranks is not None:
        uploader = sharded_checkpoint.ShardedUploader(ranks, model, store, staging, recipe["checkpoint"]["keep"],
                                                      protected=checkpoint.phase_finals(recipe["phases"]))
        name, state = sharded_checkpoint.resume(ranks, model, store, staging)  # the adapter loaded in place
    else:
        uploader = checkpoint.Uploader(store, staging, recipe["checkpoint"]["keep"],
                                       protected=checkpoint.phase_finals(recipe["phases"]))
        name = checkpoint.latest_complete(store)
    phases = recipe["phases"]
    start_phase, resumed = 0, None
    if name:
        if ranks is None:
            adapter, state = checkpoint.load(store, name, Path(staging) / "resume")
        if state["phase_index"] >= len(phases) or phases[state["phase_index"]]["name"] != state["phase_name"]:
            raise RecipeError(f"checkpoint {name} is from phase {state['phase_name']!r}, which this recipe does not "
                              f"have at position {state['phase_index']}; use the recipe the run started with or "
                              "another checkpoint.store")
        if ranks is None:
            set_peft_model_state_dict(model, {k: v.to(device) for k, v in adapter.items()})
        start_phase = state["phase_index"]
        if state["step"] >= phases[start_phase]["steps"]:
            start_phase += 1  # that phase finished; the next starts from its adapter
        else:
            resumed = state
        out(f"resuming from checkpoint {name}")

    sinks = open_sinks(recipe["metrics"]) if ranks is None or ranks.main else []
    # DeltaNet layers read the packed samples' boundaries on the host (training/packing.py): nothing to capture.
    capturable = not families.family_of(base.config).linear_attention
    capturable = capturable and ranks is None  # the experts' exchange reads its split sizes on the host
    # Up to one graph per DPO/KTO length bucket: the graphs share one memory pool, so each more holds little beyond
    # its own inputs (training/graphs.py).
    graphs = (MicroStepGraphs(groups["trainable"], max_graphs=len(length_buckets(recipe["seq_len"])))
              if device.type == "cuda" and recipe["cuda_graphs"] and capturable else None)
    try:
        # Gradients reach .grad through backward() only and nothing hooks them: the experts' backward may add the
        # routed LoRA gradients into .grad itself.
        with moe_lora.grads_accumulated_in_place(model):
            for phase_index in range(start_phase, len(phases)):
                run_phase(recipe, phase_index, model, tokenizer, groups, uploader, sinks, device,
                          resumed=resumed if resumed and resumed["phase_index"] == phase_index else None, out=out,
                          graphs=graphs, ranks=ranks)
    finally:
        uploader.wait()  # also when stopped on request: the last checkpoint must reach the store
        for sink in sinks:
            sink.close()
        distributed.leave(ranks)
    out("run complete" if start_phase < len(phases) else "run already complete; nothing to do")
    return model


# Growable segments instead of fixed-size blocks for the CUDA caching allocator: the 48-layer 30B-A3B step on an H200
# held 94.2 GiB instead of 97.1 at the same speed, CUDA-graph pools included (bench/NOTES_train_step.md).
ALLOCATOR_DEFAULTS = "expandable_segments:True"


def allocator_defaults():
    """The CUDA allocator's options, unless the environment sets its own; call before the first CUDA allocation."""
    if "PYTORCH_ALLOC_CONF" not in os.environ:
        os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", ALLOCATOR_DEFAULTS)


def main(argv=None):
    allocator_defaults()
    parser = argparse.ArgumentParser(prog="python -m training.train", description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", required=True, help="the recipe (YAML or JSON)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    # SIGTERM (the agent's dead-man switch, or a person) ends the run after the current step and a checkpoint.
    signal.signal(signal.SIGTERM, lambda *_: STOP.set())
    try:
        recipe = load_recipe(args.recipe)
        run(recipe, out=lambda line: print(line, flush=True))
    except RecipeError as exc:
        print(f"recipe error: {exc}", file=sys.stderr, flush=True)
        return 2
    except guards.GuardError as exc:
        print(f"ABORTED by a guard: {exc}", file=sys.stderr, flush=True)
        return 3
    except StopRequested as exc:
        print(str(exc), flush=True)
        return STOPPED_EXIT
    return 0


if __name__ == "__main__":
    sys.exit(main())
