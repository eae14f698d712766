"""Training-step benchmark on one GPU: our MoE-LoRA backend vs transformers grouped_mm + peft, in the same run.

--model qwen3-30b-a3b (default): 48 layers, 128 experts top-8, hidden 2048, moe_intermediate 768.
--model qwen3.6-35b-a3b: the 40-layer text model, 3 Gated DeltaNet layers to 1 attention layer, 256 experts top-8,
moe_intermediate 512, a shared expert of 512, hidden 2048, vocabulary 248,320; prints which DeltaNet path ran
(flash-linear-attention or transformers' reference code), the same for both backends.
Random bf16 weights, LoRA r=32 alpha=64 on the family's targets (training/families.py) and the routed experts,
micro-batch 2 x 2048 tokens, 8 accumulation steps, AdamW.
Both backends run through the trainer's own `optimizer_step` (same loss, clipping and metrics); "ours" with the
trainer's CUDA-graph micro-steps (training/graphs.py), "ours:eager" without them. Reports tokens/s,
seconds per optimizer step and peak memory; if a configuration runs out of memory it says so and tries the next (for
the baseline: gradient checkpointing; for ours: fewer layers). Last line: one JSON object.

    python bench/train_step.py [--model qwen3.6-35b-a3b] [--layers 48] [--steps 2] [--accum 8]
    python bench/train_step.py --model qwen3.6-35b-a3b --layers 2 --experts 16 --tokens small   (a CPU run)
    python bench/train_step.py --smoke [--model ...]   the model's family in miniature (training/examples/tiny.py),
        one step of 1 x 64 tokens, float32: a check that the benchmark runs, in seconds on a CPU
    python bench/train_step.py --phase dpo --layers 8 --backends ours [--attention sdpa]   DPO micro-steps (2 pairs,
        right-padded to 2048), on our attention or transformers' sdpa path
    python bench/train_step.py --packed 600   rows packed from documents of 600 tokens on average, as the trainer
        packs CPT data (each row's samples kept apart), for both backends
    python bench/train_step.py --gpus 4 [--model ...]   ours on 4 ranks of this box (torchrun, FSDP2 + expert
        parallel, training/distributed.py): tokens/s in all and per GPU, peak memory per GPU; each rank its own
        micro-batches (the global batch is N times one GPU's); compare with --gpus 1 for the scaling
    python bench/train_step.py --gpus 2 --device cpu --layers 2 --experts 16 --tokens small   (its CPU smoke run)
    python bench/train_step.py --backends ours --steps 20 --router-every 10   the router's load counted as the trainer
        counts it (run again with --router-every 0 for the overhead: compare mean_seconds_per_optimizer_step)
    python bench/train_step.py --backends ours --steps 4 --eval-every 2 --eval-rows 16   held-out validation as the
        trainer runs it (training/validation.py) on 16 rows (or pairs with --phase dpo) every 2 steps: its seconds
        and its share of the steps at an eval_every of 200 (eval_overhead_at_200)
    BENCH_TRACE=replays.json python bench/train_step.py --profile 4   also writes the graphed replays' kernels
        (start, duration) as a Chrome trace
    python bench/train_step.py --model qwen3.6-35b-a3b --backends ours --memory-plan auto --memory-history
        also where the first step's peak reserve went: the blocks alive at its peak by the code that made them
        (bench/memory_history.py)
    python bench/train_step.py --model qwen3.6-35b-a3b --backends ours --memory-budget-gib 80 --memory-plan auto
        a card's memory imposed (torch.cuda.set_per_process_memory_fraction) and the plan the trainer would take in
        it (training/memory_plan.py: checkpointing, optimizer state), with its predicted figures beside the measured
    python bench/train_step.py --backends ours --optimizer adamw_8bit [--memory-budget-gib 80]   8-bit moments
        (ours, training/kernels/adamw8bit.py; --eight-bit torchao for torchao's), or adamw_offload (on the host)
"""

import argparse
import contextlib
import gc
import importlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from training import distributed
from training.families import family_of
from training.linear_attention import deltanet_path
from training.lora import attach_lora, lora_config, model_targets
from training.rope import restore_original_rope
from training import fitting, memory_plan, optimizers
from training.out_of_memory import is_out_of_memory, tune_past_out_of_memory
from training import moe_lora, router_load, validation
from training.graphs import MicroStepGraphs, eager_micro_step
from training.data import IGNORE, _pack, boundaries_width, collate, pad_pairs
from training.packing import with_host_ends
from training.losses import causal_lm_loss, dpo_loss
from training.phase import PhaseLoss, Trainee, lr_lambda, to_device
from training.examples.tiny import TINY_CONFIG, TINY_QWEN3_5_CONFIG
from training.recipe import ModelSettings
from training.train import allocator_defaults, build_model, parameter_groups
import memory_history

MODELS = {
    "qwen3-30b-a3b": ({
        "model_type": "qwen3_moe", "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144,
        "moe_intermediate_size": 768, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
        "num_experts": 128, "num_experts_per_tok": 8, "norm_topk_prob": True, "max_position_embeddings": 4096,
        "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
    }, 48),
    "qwen3.6-35b-a3b": ({
        "model_type": "qwen3_5_moe_text", "vocab_size": 248320, "hidden_size": 2048, "moe_intermediate_size": 512,
        "shared_expert_intermediate_size": 512, "num_experts": 256, "num_experts_per_tok": 8,
        "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256, "linear_num_value_heads": 32,
        "linear_num_key_heads": 16, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
        "linear_conv_kernel_dim": 4, "full_attention_interval": 4, "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
    }, 40),
}
CONFIG = MODELS["qwen3-30b-a3b"][0]
SMOKE_MODELS = {"qwen3-30b-a3b": TINY_CONFIG, "qwen3.6-35b-a3b": TINY_QWEN3_5_CONFIG}  # each family in miniature
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def build(backend, config, layers, checkpointing):
    dtype = "bfloat16" if DEVICE.type == "cuda" else "float32"  # the CPU smoke run: float32 matmuls
    base = build_model(ModelSettings(config={**config, "num_hidden_layers": layers}, dtype=dtype), DEVICE)
    if checkpointing:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if backend.startswith("ours"):
        model = attach_lora(base, r=32, alpha=64)
    else:
        from peft import get_peft_model

        restore_original_rope()  # off the shelf: transformers' rotary embedding, even after ours ran in this process
        base.set_experts_implementation("grouped_mm")
        model = get_peft_model(base, lora_config(32, 64, model_targets(base)))  # the same targets as ours
    model.train()
    return model


def measure(backend, config, layers, checkpointing, steps, accum, batch, seq_len, graphs=False, packed=None,
            kind="cpt", attention=None, router_every=0, eval_every=0, eval_rows=0):
    model = build(backend, config, layers, checkpointing)
    # As the trainer counts the router's load (training/router_load.py): in every micro-step, read every N steps.
    counter = router_load.attach_counter(model, DEVICE) if router_every and backend.startswith("ours") else None
    if attention:  # the attention implementation to run instead (transformers' "sdpa": the change's own measure)
        model.config._attn_implementation = attention
    plan = planned(model, batch * seq_len * (2 if kind == "dpo" else 1), checkpointing)
    if plan is not None and plan.checkpointing and not checkpointing:  # every layer, or the plan's first few
        fitting.checkpoint_layers(model.get_base_model(), fitting.Choice(True, plan.optimizer, plan, plan.name))
    checkpointing = plan.checkpointing if plan is not None else checkpointing
    optimizer_name = plan.optimizer if plan is not None else MEMORY["optimizer"]
    fitting.cast_factors(model, optimizer_name)  # as the trainer does
    groups = parameter_groups(model)
    runner = MicroStepGraphs(groups["trainable"]) if graphs else None
    optimizer = eight_bit_or_built(optimizer_name, groups["trainable"])
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda("constant", 0, 100, 1.0))
    if kind == "dpo":
        micro, loss_fn = preference_batches(config, accum, batch, seq_len), dpo_loss
        phase = {"kind": "dpo", "beta": 0.1}
    else:
        micro, loss_fn, phase = micro_batches(model, config, accum, batch, seq_len, packed), causal_lm_loss, \
            {"kind": "cpt"}
    ctx = {"device": DEVICE, "tokenizer": None, "reward_fn": None}
    trainee = Trainee(model, groups, distributed.OneRank(DEVICE), runner, max_grad_norm=1.0, router=counter)
    # As the trainer runs (training/train.py): our experts add the routed LoRA gradients into .grad themselves.
    in_place = moe_lora.grads_accumulated_in_place(model) if backend.startswith("ours") else contextlib.nullcontext()
    with in_place:
        # Warm-up: one whole step (Triton autotuning, allocator; with graphs: 2 eager micro-steps, the capture,
        # replays), guard on (it must pass on ours); with --memory-history, under the allocator's record.
        first_step = {}
        with memory_history.recorded(first_step) if MEMORY["history"] else contextlib.nullcontext():
            trainee.optimizer_step(micro, PhaseLoss(loss_fn, phase, ctx), optimizer, scheduler,
                                   check_guard=backend.startswith("ours"))
        warmup_peak = None
        if DEVICE.type == "cuda":
            torch.cuda.synchronize()
            warmup_peak = round(torch.cuda.max_memory_reserved() / 2**30, 1)  # eager steps, capture, first replays
            torch.cuda.reset_peak_memory_stats()
        records, router, eval_times = [], {}, []
        held_out, reference = held_out_items(config, kind, eval_rows, seq_len, packed) if eval_every else ([], None)
        if counter is not None:
            counter.reset()
        for step in range(1, steps + 1):
            records.append(trainee.optimizer_step(micro, PhaseLoss(loss_fn, phase, ctx), optimizer, scheduler))
            if counter is not None and step % router_every == 0:  # the host read, counted in the step's time
                start = time.perf_counter()
                router = router_load.summary(counter.take(trainee.ranks))
                records[-1]["step_s"] += time.perf_counter() - start
            if held_out and step % eval_every == 0:  # timed apart from the step: its share is the figure
                eval_times.append(validation.validate(
                    model, kind, held_out, settings=phase, batch_size=batch, tokenizer=PAD, device=DEVICE,
                    reference=reference)["eval_s"])
        micro_s = _micro_steps_s(model, micro, loss_fn, phase, ctx, runner)
    seconds = sorted(r["step_s"] for r in records)[len(records) // 2]
    # the tokens through the forward: DPO's real ones (not its padding)
    tokens = sum(int(m["attention_mask"].sum()) for m in micro) if kind == "dpo" else accum * batch * seq_len
    result = {
        "backend": backend, "cuda_graphs_replayed": runner is not None and runner.replaying, "layers": layers,
        "phase": kind, "attention": model.config._attn_implementation, "packed_mean_tokens": packed,
        "gradient_checkpointing": checkpointing, "optimizer": type(optimizer).__name__,
        "optimizer_from": type(optimizer).__module__.split(".")[0],
        "factor_dtype": str(groups["trainable"][0].dtype).removeprefix("torch."),
        "memory_budget_gib": MEMORY["budget_gib"], "memory_plan": plan.to_dict() if plan is not None else None,
        "seconds_per_optimizer_step": round(seconds, 3), "ms_per_micro_step": round(1000 * seconds / accum, 1),
        "tokens_per_second": round(tokens / seconds), **_peaks(), "warmup_peak_reserved_gib": warmup_peak,
        **first_step,  # memory_history: where the first step's peak reserve went (--memory-history)
        # of an optimizer step: the micro-steps alone, and the rest (clipping, norms, AdamW, zeroing, the record)
        "micro_steps_s": round(micro_s, 3), "rest_of_step_s": round(seconds - micro_s, 3),
        "deltanet_path": deltanet_path() if family_of(model.config).linear_attention else None,
        "loss": round(records[-1]["loss"], 4), "kernel_path": records[-1]["kernel_path"],
        "losses": [r["loss"] for r in records],
        "grad_norms_routed": [r["grad_norm_routed"] for r in records],
        "grad_norms_attention": [r["grad_norm_attention"] for r in records],
        "grad_norms_linear_attention": [r["grad_norm_linear_attention"] for r in records],
        "grad_norms_shared_expert": [r["grad_norm_shared_expert"] for r in records],
        "routed_b_zero": records[-1]["routed_b_zero"],
        # with --router-every: the mean step (it holds the reads the median may miss) and the last read's figures
        "router_every": router_every if counter is not None else 0,
        "mean_seconds_per_optimizer_step": round(sum(r["step_s"] for r in records) / len(records), 4),
        "router_max_mean": router.get("router_max_mean"), "router_idle_experts": router.get("router_idle_experts"),
        "router_counted": sum(map(sum, router.get("router_load", []))),
        # with --eval-every: the validations' median seconds, and their share of the training at eval_every 200
        "eval_every": eval_every, "eval_rows": len(held_out), "eval_runs": len(eval_times),
        "eval_s": round(sorted(eval_times)[len(eval_times) // 2], 4) if eval_times else None,
        "eval_overhead_at_200": (round(sorted(eval_times)[len(eval_times) // 2] / (200 * seconds), 5)
                                 if eval_times else None),
    }
    del model, optimizer, scheduler, groups, micro, runner, trainee
    return result


# The memory settings of this benchmark (--optimizer, --memory-budget-gib, --memory-plan, --eight-bit,
# --memory-history), set by main.
MEMORY = {"optimizer": "adamw", "budget_gib": None, "plan": "off", "eight_bit": "ours", "history": False}


def eight_bit_or_built(name, params):
    """The optimizer the trainer would build; with --eight-bit torchao, torchao's 8-bit moments instead of ours."""
    if name == "adamw_8bit" and MEMORY["eight_bit"] == "torchao":
        return importlib.import_module("torchao.optim").AdamW8bit(params, lr=1e-4)
    return optimizers.build(name, params, lr=1e-4, weight_decay=0.0, device=DEVICE)


def planned(model, tokens, checkpointing):
    """With --memory-plan auto, the plan the trainer would take for this model (LoRA attached) and micro-step in the
    budget (or what the GPU has): training/fitting.py's; None otherwise, or on a CPU without a budget."""
    if MEMORY["plan"] != "auto" or (DEVICE.type != "cuda" and MEMORY["budget_gib"] is None):
        return None
    run = fitting.counted_run_of(model, tokens, gpus=1)
    usable = MEMORY["budget_gib"] if MEMORY["budget_gib"] is not None else fitting.usable_memory_gib(DEVICE)
    # none fits: the most frugal, which the benchmark reports running out of memory; a CPU has no host to offload to
    plan = memory_plan.take(run, usable, MEMORY["optimizer"], checkpointing,
                            host_gib=fitting.host_memory_gib() if DEVICE.type == "cuda" else 0.0)
    print(f"memory plan: {fitting.describe(plan)}", flush=True)
    return plan


def micro_batches(model, config, accum, batch, seq_len, packed=None):
    """`accum` micro-batches of batch x seq_len random tokens: whole rows, or with `packed` (a mean document length)
    documents of random lengths (exponential, 16 to seq_len tokens) packed into rows as the trainer packs CPT data
    (training/data.py: positions restarting per document, their boundaries padded to one width for all, each
    document's first token no target; their host sample ends where the model's DeltaNet layers take them)."""
    gen = torch.Generator().manual_seed(0)
    if packed is None:
        ids = [torch.randint(0, config["vocab_size"], (batch, seq_len), generator=gen) for _ in range(accum)]
        return [{"input_ids": x.to(DEVICE), "labels": x.to(DEVICE)} for x in ids]
    rows = [_packed_rows(config["vocab_size"], batch, seq_len, packed, gen) for _ in range(accum)]
    width = boundaries_width([row for micro in rows for row in micro], batch)
    return [to_device(with_host_ends(model, collate("cpt", micro, 0, width=width)), DEVICE) for micro in rows]


def preference_batches(config, accum, pairs, seq_len):
    """`accum` DPO micro-batches of `pairs` random (prompt, chosen, rejected) triples, right-padded to seq_len as
    the trainer pads them when graphs replay (training/data.py pad_pairs; one pair of each micro-batch is long
    enough for the top bucket, so one graph replays them all), the reference log-probs zero."""
    gen = torch.Generator().manual_seed(0)

    def tokens(n):
        return torch.randint(0, config["vocab_size"], (n,), generator=gen).tolist()

    micro = []
    for _ in range(accum):
        rows = {"chosen": [], "rejected": []}
        for i in range(pairs):
            prompt = int(torch.randint(seq_len // 32, seq_len // 4, (1,), generator=gen))  # 64-511 at 2048
            low = seq_len * 3 // 4 if i == 0 else seq_len // 32
            for side in rows:
                completion = int(torch.randint(low, seq_len - prompt, (1,), generator=gen))
                rows[side].append((tokens(prompt), tokens(completion)))
        batch = pad_pairs(rows["chosen"] + rows["rejected"], 0, seq_len)
        batch["ref_logps"] = torch.zeros(2 * pairs)
        micro.append(to_device(batch, DEVICE))
    return micro


class _Pad:
    pad_token_id = 0


PAD = _Pad()  # all validation asks of a tokenizer for CPT and DPO rows


def held_out_items(config, kind, count, seq_len, packed=None):
    """(held-out items as the trainer keeps them, the DPO reference): `count` CPT rows of seq_len random tokens
    (packed from documents with `packed`), or `count` DPO pairs shaped as `preference_batches` makes them."""
    gen = torch.Generator().manual_seed(1)
    if kind == "dpo":
        pairs = [(batch["input_ids"][i], batch["attention_mask"][i], batch["labels"][i])
                 for batch in preference_batches(config, 1, count, seq_len) for i in range(2 * count)]
        sides = [(ids[:int(mask.sum())].tolist(), int((labels == IGNORE)[:int(mask.sum())].sum()))
                 for ids, mask, labels in pairs]
        items = [{"chosen": (c[:cp], c[cp:]), "rejected": (r[:rp], r[rp:])}
                 for (c, cp), (r, rp) in zip(sides[:count], sides[count:], strict=True)]
        return items, torch.zeros(count, 2)
    if packed is not None:
        return _packed_rows(config["vocab_size"], count, seq_len, packed, gen), None
    rows = []
    for _ in range(count):
        ids = torch.randint(0, config["vocab_size"], (seq_len,), generator=gen).tolist()
        rows += _pack([(ids, ids)], seq_len, pad_id=0)
    return rows, None


def _packed_rows(vocab_size, batch, seq_len, mean, gen):
    documents = []
    while True:
        length = min(seq_len, max(16, int(torch.empty(1).exponential_(1 / mean, generator=gen))))
        ids = torch.randint(0, vocab_size, (length,), generator=gen).tolist()
        documents.append((ids, ids))
        rows = _pack(documents, seq_len, pad_id=0)
        if len(rows) > batch:  # the first `batch` rows are as full as packing makes them
            return rows[:batch]


def _micro_steps_s(model, micro, loss_fn, phase, ctx, runner):
    """Seconds for one optimizer step's micro-steps alone (forward, loss, backward), as optimizer_step runs them;
    the gradients they add are zeroed after."""
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for batch in micro:
        (runner.run if runner is not None else eager_micro_step)(model, loss_fn, batch, phase, ctx, 1.0 / len(micro))
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    for p in model.parameters():
        if p.grad is not None:
            p.grad.zero_()
    return seconds


def _peaks():
    if DEVICE.type != "cuda":
        return {"peak_gib": None, "peak_reserved_gib": None}
    # a captured graph's pool is allocated at capture and reused by every replay without the allocator seeing it,
    # so with graphs only the reserved figure counts the activations
    free, total = torch.cuda.mem_get_info()
    return {"peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 1),
            "peak_reserved_gib": round(torch.cuda.max_memory_reserved() / 2**30, 1),
            # what the card holds beside the allocator's reserve now: the CUDA context, the loaded kernels, the
            # local memory of spilling kernels (memory_plan.OUTSIDE_ALLOCATOR_GIB counts the last two)
            "outside_allocator_gib": round((total - free - torch.cuda.memory_reserved()) / 2**30, 2),
            "reserved_gib_by_pool": _reserved_by_pool()}


def _reserved_by_pool():
    """GiB the allocator holds now: in the general pool, in CUDA-graph pools, and of that what no tensor uses."""
    held, graph, free = 0, 0, 0
    for segment in torch.cuda.memory_snapshot():
        held += segment["total_size"]
        if tuple(segment.get("segment_pool_id", (0, 0))) != (0, 0):
            graph += segment["total_size"]
        free += sum(b["size"] for b in segment["blocks"] if b["state"] == "inactive")
    return {"all": round(held / 2**30, 2), "graph_pools": round(graph / 2**30, 2),
            "not_in_use": round(free / 2**30, 2)}


def profile(backend, layers, batch, seq_len):
    """Where a micro-step's time goes: host time to enqueue it against device time, and the top ops of each."""
    from torch.profiler import ProfilerActivity, profile as torch_profile

    model = build(backend, CONFIG, layers, False)
    gen = torch.Generator(device="cuda").manual_seed(0)
    ids = torch.randint(0, CONFIG["vocab_size"], (batch, seq_len), device="cuda", generator=gen)
    batch_ = {"input_ids": ids, "labels": ids}
    phase, ctx = {"kind": "cpt"}, {"device": torch.device("cuda")}

    def micro():
        loss, _ = causal_lm_loss(model, batch_, phase, ctx)
        loss.backward()

    for _ in range(3):
        micro()
    torch.cuda.synchronize()
    host, device = [], []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        start.record()
        loss, _ = causal_lm_loss(model, batch_, phase, ctx)
        t1 = time.perf_counter()
        loss.backward()
        end.record()
        t2 = time.perf_counter()
        torch.cuda.synchronize()
        host.append((t1 - t0, t2 - t1, time.perf_counter() - t0))
        device.append(start.elapsed_time(end))
    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(2):
            micro()
        torch.cuda.synchronize()
    averages = prof.key_averages()
    print(averages.table(sort_by="self_cuda_time_total", row_limit=60, max_name_column_width=90), flush=True)
    print(averages.table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=70), flush=True)
    del loss  # its autograd graph would keep the eager steps' gradient nodes (and their stream) alive
    saved = saved_bytes(model, micro)
    with moe_lora.grads_accumulated_in_place(model):
        graphed = graphed_ms(model, batch_, phase, ctx)
    mid = sorted(range(5), key=lambda i: device[i])[2]
    print(json.dumps({"profile": backend, "layers": layers, "host_forward_ms": round(host[mid][0] * 1e3, 1),
                      "host_backward_ms": round(host[mid][1] * 1e3, 1), "wall_ms": round(host[mid][2] * 1e3, 1),
                      "device_ms": round(device[mid], 1), **graphed, "fused_rope": _fused_rope(model),
                      "saved_mib_per_layer": saved}), flush=True)


def _fused_rope(model):
    """Whether the attention's rotary embedding runs on our kernel (training/rope.py)."""
    home = sys.modules.get(type(model.get_base_model()).__module__)
    return bool(getattr(getattr(home, "apply_rotary_pos_emb", None), "fused_rope", False))


def saved_bytes(model, micro):
    """MiB that autograd keeps for the backward, per kind of module (innermost module running when it was saved),
    averaged over the decoder layers; each storage counted once, the parameters not at all."""
    stack, totals = [], {}
    seen = {(p.untyped_storage().data_ptr(), p.device) for p in model.parameters()}

    def pre(module, args):
        stack.append(type(module).__name__)

    def post(module, args, out):
        stack.pop()

    def pack(tensor):
        key = (tensor.untyped_storage().data_ptr(), tensor.device)
        if key not in seen:
            seen.add(key)
            owner = stack[-1] if stack else "outside modules"
            totals[owner] = totals.get(owner, 0) + tensor.untyped_storage().nbytes()
        return tensor

    handles = [m.register_forward_pre_hook(pre) for m in model.modules()]
    handles += [m.register_forward_hook(post) for m in model.modules()]
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            micro()
    finally:
        for handle in handles:
            handle.remove()
    layers = model.config.num_hidden_layers
    return {k: round(v / layers / 2**20, 1) for k, v in sorted(totals.items(), key=lambda kv: -kv[1])}


def graphed_ms(model, batch, phase, ctx):
    """Device ms of one micro-step replayed from a CUDA graph (as the trainer runs it) and the memory it holds."""
    params = parameter_groups(model)["trainable"]
    runner = MicroStepGraphs(params)
    torch.cuda.synchronize()
    before = torch.cuda.memory_reserved()
    for _ in range(2):  # two eager warm-ups on the side stream
        runner.run(model, causal_lm_loss, batch, phase, ctx, 1.0)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    live_before = torch.cuda.memory_allocated()
    runner.run(model, causal_lm_loss, batch, phase, ctx, 1.0)  # the capture, then its first replay
    torch.cuda.synchronize()
    # the most the capture had live at once, against what its pool holds: the rest is the pool's fragmentation
    capture_peak_live = torch.cuda.max_memory_allocated() - live_before
    times = []
    for _ in range(10):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        runner.run(model, causal_lm_loss, batch, phase, ctx, 1.0)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    graphed = sorted(times)[5]
    # The kernels of the replays themselves (the profiler sees each kernel inside a graph): what a replay spends
    # between kernels is the rest of its time.
    from torch.profiler import ProfilerActivity, profile as torch_profile

    replays = 3
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            runner.run(model, causal_lm_loss, batch, phase, ctx, 1.0)
        torch.cuda.synchronize()
    kernel_ms = sum(e.self_device_time_total if hasattr(e, "self_device_time_total") else e.self_cuda_time_total
                    for e in prof.key_averages()) / 1000 / replays
    print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=25, max_name_column_width=90),
          flush=True)
    if os.environ.get("BENCH_TRACE"):  # every kernel's start and duration, for the gaps between them
        prof.export_chrome_trace(os.environ["BENCH_TRACE"])
    return {"graphed_ms": round(graphed, 2), "graphed_kernel_ms": round(kernel_ms, 2),
            "graphed_between_kernels_ms": round(graphed - kernel_ms, 2), "captured": runner.replaying,
            "graph_reserved_gib": round((torch.cuda.memory_reserved() - before) / 2**30, 2),
            "capture_peak_live_gib": round(capture_peak_live / 2**30, 2)}


def attempt(backend, layers, checkpointing, args):
    result, error, oom_peak = None, None, None
    graphs = backend == "ours" and DEVICE.type == "cuda"  # "ours:eager": the same, plain eager micro-steps
    try:
        result = measure(backend, args.config, layers, checkpointing, args.steps, args.accum, args.batch, args.seq_len,
                         graphs, args.packed, args.phase, args.attention, args.router_every, args.eval_every,
                         args.eval_rows)
    except RuntimeError as exc:  # PyTorch's allocator's out of memory, or CUDA's own as a Triton launch says it
        if not is_out_of_memory(exc):
            raise
        error = str(exc)[:160]
        if DEVICE.type == "cuda":  # where it got to, in the warm-up or the timed steps
            oom_peak = round(torch.cuda.max_memory_reserved() / 2**30, 1)
    # Outside the except block, so the traceback (and the model it holds) is gone before the memory is returned.
    gc.collect()
    if DEVICE.type == "cuda":
        torch.cuda.empty_cache()
    if result is None:
        print(f"{backend} layers={layers} checkpointing={checkpointing}: out of memory ({error})", flush=True)
        return {"backend": backend, "layers": layers, "gradient_checkpointing": checkpointing, "oom": True,
                "error": error, "peak_reserved_gib": oom_peak}
    return result


def measure_ranks(args):
    """One rank of `--gpus N`: ours (eager: the expert exchange does not capture) through the trainer's own
    sharding and optimizer step; rank 0 prints the figures of every rank."""
    global DEVICE
    ranks = distributed.join(args.gpus, args.device if args.device != "auto" else None)
    DEVICE = ranks.device
    dtype = "bfloat16" if DEVICE.type == "cuda" else "float32"
    base = build_model(ModelSettings(config={**args.config, "num_hidden_layers": args.layers}, dtype=dtype),
                       ranks.build_device())  # the first rank loads, the others receive
    model = ranks.shard(attach_lora(base, r=32, alpha=64))
    model.train()
    groups = parameter_groups(model)
    optimizer = torch.optim.AdamW(groups["trainable"], lr=1e-4, fused=DEVICE.type == "cuda")
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda("constant", 0, 100, 1.0))
    gen = torch.Generator(device=DEVICE).manual_seed(ranks.rank)
    micro = [{"input_ids": x, "labels": x} for x in (
        torch.randint(0, args.config["vocab_size"], (args.batch, args.seq_len), device=DEVICE, generator=gen)
        for _ in range(args.accum))]
    loss = PhaseLoss(causal_lm_loss, {"kind": "cpt"}, {"device": DEVICE, "tokenizer": None, "reward_fn": None})
    trainee = Trainee(model, groups, ranks, max_grad_norm=1.0)
    trainee.optimizer_step(micro, loss, optimizer, scheduler, check_guard=True)  # warm-up, the guard on every rank
    records = [trainee.optimizer_step(micro, loss, optimizer, scheduler) for _ in range(args.steps)]
    peaks = ranks.gather(_peaks())
    if ranks.main:
        seconds = sorted(r["step_s"] for r in records)[len(records) // 2]
        tokens = records[-1]["tokens"]
        print(json.dumps({
            "model": args.model, "backend": "ours:eager", "gpus": ranks.size, "device": DEVICE.type,
            "layers": args.layers, "seconds_per_optimizer_step": round(seconds, 3),
            "tokens_per_second": round(tokens / seconds),
            "tokens_per_second_per_gpu": round(tokens / seconds / ranks.size),
            "peak_gib_per_gpu": [p["peak_gib"] for p in peaks],
            "peak_reserved_gib_per_gpu": [p["peak_reserved_gib"] for p in peaks],
            "loss": round(records[-1]["loss"], 4), "kernel_path": records[-1]["kernel_path"],
            "grad_norms_routed_per_rank": [r["grad_norm_routed_local"] for r in records[-1]["ranks"]],
        }), flush=True)
    ranks.leave()
    return 0


def main():
    allocator_defaults()  # as the trainer runs
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=sorted(MODELS), default="qwen3-30b-a3b")
    parser.add_argument("--layers", type=int, help="default: the model's own (48 or 40)")
    parser.add_argument("--experts", type=int, help="fewer routed experts than the model's (a CPU smoke run)")
    parser.add_argument("--tokens", choices=("full", "small"), default="full",
                        help="small: one step of one micro-batch of 1 x 64 tokens (a smoke run)")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--accum", type=int, default=8)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--backends", default="ours,ours:eager,grouped_mm+peft",
                        help="ours (micro-steps in CUDA graphs, as the trainer runs them), ours:eager, grouped_mm+peft")
    parser.add_argument("--profile", type=int, metavar="LAYERS", help="profile one micro-step of ours on LAYERS layers")
    parser.add_argument("--phase", choices=("cpt", "dpo"), default="cpt",
                        help="dpo: --batch pairs per micro-batch (chosen and rejected rows), right-padded to --seq-len")
    parser.add_argument("--attention", choices=("sdpa",), help="run ours on transformers' sdpa attention path instead")
    parser.add_argument("--packed", type=int, metavar="MEAN_TOKENS",
                        help="rows packed from documents of this mean length (default: one document per row)")
    parser.add_argument("--gpus", type=int, default=1, help="ours on this many ranks of the box (started by torchrun)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="with --gpus: cpu runs the ranks on the CPU (gloo)")
    parser.add_argument("--router-every", type=int, metavar="N",
                        help="ours counts the router's load as the trainer does, read every N steps (0: off; the "
                             "default, but 1 with --smoke); compare with 0 for its overhead")
    parser.add_argument("--eval-every", type=int, metavar="N",
                        help="validate on held-out rows every N steps as the trainer does (0: off; the default, but 1 "
                             "with --smoke); eval_overhead_at_200 is its share of the steps at eval_every 200")
    parser.add_argument("--eval-rows", type=int, default=16, metavar="R",
                        help="held-out rows of --seq-len tokens (with --phase dpo: pairs) each validation reads")
    parser.add_argument("--optimizer", choices=memory_plan.OPTIMIZERS, default="adamw",
                        help="the optimizer's state: float32 moments, 8-bit or on the host")
    parser.add_argument("--memory-budget-gib", type=float, metavar="GIB",
                        help="the memory of a smaller card, imposed with torch.cuda.set_per_process_memory_fraction")
    parser.add_argument("--memory-plan", choices=("off", "auto"), default="off",
                        help="auto: ours takes the memory plan the trainer would (checkpointing, optimizer state) in "
                             "the budget, instead of trying without checkpointing first")
    parser.add_argument("--eight-bit", choices=("ours", "torchao"), default="ours",
                        help="8-bit moments on training/kernels/adamw8bit.py (what the trainer builds) or torchao's")
    parser.add_argument("--memory-history", action="store_true",
                        help="record the allocator over the first step and report where its peak reserve went "
                             "(bench/memory_history.py; slower: every allocation keeps its Python stack)")
    parser.add_argument("--smoke", action="store_true",
                        help="the model's family in miniature, one step of 1 x 64 tokens (a check that it runs)")
    args = parser.parse_args()
    if args.gpus > 1 and "WORLD_SIZE" not in os.environ:
        return subprocess.call([*distributed.launcher(args.gpus), __file__, *sys.argv[1:]])
    config, layers = MODELS[args.model]
    if args.smoke:
        config, layers, args.tokens = SMOKE_MODELS[args.model], SMOKE_MODELS[args.model]["num_hidden_layers"], "small"
    args.config = {**config, **({"num_experts": args.experts} if args.experts else {})}
    args.layers = args.layers or layers
    if args.tokens == "small":
        args.steps, args.accum, args.batch, args.seq_len = 1, 1, 1, 64
    if args.router_every is None:
        args.router_every = 1 if args.smoke else 0
    if args.eval_every is None:
        args.eval_every = 1 if args.smoke else 0
    if args.smoke:
        args.eval_rows = 2
    if args.gpus > 1:
        return measure_ranks(args)
    MEMORY.update(optimizer=args.optimizer, budget_gib=args.memory_budget_gib, plan=args.memory_plan,
                  eight_bit=args.eight_bit, history=args.memory_history)
    if DEVICE.type == "cuda":  # a smaller card's budget, or as the trainer caps its allocator on the whole card
        fitting.cap_allocator(DEVICE, args.memory_budget_gib or fitting.usable_memory_gib(DEVICE))
        tune_past_out_of_memory()  # as the trainer tunes
    name = torch.cuda.get_device_name() if DEVICE.type == "cuda" else "cpu"
    print(f"device {name}, torch {torch.__version__}, model {args.model}", flush=True)
    if args.profile:
        profile("ours", args.profile, args.batch, args.seq_len)
        return 0
    results = []
    for backend in args.backends.split(","):
        # Without gradient checkpointing first; then with it; then fewer layers, until one fits.
        plans = [(args.layers, False), (args.layers, True)] + [(n, True) for n in (36, 24, 12) if n < args.layers]
        if args.memory_plan == "auto":
            plans = [(args.layers, False)]  # the plan chooses checkpointing and the optimizer's state
        if DEVICE.type != "cuda":
            plans = plans[:1]  # no out-of-memory fallbacks to try on the CPU
        for layers, checkpointing in plans:
            start = time.perf_counter()
            result = attempt(backend, layers, checkpointing, args)
            result["wall_s"] = round(time.perf_counter() - start, 1)
            print(json.dumps(result), flush=True)
            results.append(result)
            if not result.get("oom"):
                break
    ok = {r["backend"]: r for r in results if not r.get("oom")}
    print("| backend | layers | grad ckpt | tokens/s | s/opt step (8 x 2x2048) | peak allocated GiB "
          "| peak reserved GiB |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        if r.get("oom"):
            print(f"| {r['backend']} | {r['layers']} | {r['gradient_checkpointing']} | OOM | - | - | - |")
        else:
            print(f"| {r['backend']}{' (graphs)' if r['cuda_graphs_replayed'] else ''} | {r['layers']} | "
                  f"{r['gradient_checkpointing']} | {r['tokens_per_second']:,} | "
                  f"{r['seconds_per_optimizer_step']} | {r['peak_gib']} | {r['peak_reserved_gib']} |")
    summary = {"model": args.model, "results": results, "memory_budget_gib": args.memory_budget_gib,
               "goal_tokens_per_second": 22000, "goal_peak_reserved_gib": 90,
               "deltanet_path": next((r.get("deltanet_path") for r in results if r.get("deltanet_path")), None)}
    if "ours" in ok and "grouped_mm+peft" in ok:
        summary["speedup"] = round(ok["ours"]["tokens_per_second"] / ok["grouped_mm+peft"]["tokens_per_second"], 2)
    if "ours" in ok and "ours:eager" in ok and ok["ours"]["layers"] == ok["ours:eager"]["layers"]:
        # Same model, same data, same steps: replayed graphs must train as the eager steps do.
        graphed, eager = ok["ours"], ok["ours:eager"]
        summary["graphs_vs_eager_max_rel_diff"] = {
            key: max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(graphed[key], eager[key], strict=True))
            for key in ("losses", "grad_norms_routed", "grad_norms_attention")
        }
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
