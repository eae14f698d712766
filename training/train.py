"""The MoE-LoRA trainer: `python -m training.train --recipe recipe.yaml`; started again after a kill, it continues from
the last complete checkpoint (docs/training.md, "training/train.py")."""

import argparse
import dataclasses
import functools
import gc
import logging
import os
import signal
import sys
import threading
import time

import torch

from training import checkpoint, distributed, families, guards, model_source, moe_lora, router_load
from training import fitting, trainer_exits
from training.data import length_buckets, load_tokenizer
from training.graphs import MicroStepGraphs
from training.lora import attach_lora, module_lora_parameters, routed_lora_parameters
from training.metrics import open_sinks
from training.out_of_memory import is_out_of_memory, tune_past_out_of_memory
from training.phase import Phase, Trainee
from training.recipe import EVAL_KIND, ModelSettings, RecipeError, RunRecipe, load_recipe

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


def build_model(model: ModelSettings, device):
    from transformers import AutoConfig, AutoModelForCausalLM

    dtype = getattr(torch, model.dtype)
    if model.config is not None:
        fields = dict(model.config)
        config = AutoConfig.for_model(fields.pop("model_type"), **fields)
        torch.manual_seed(model.seed)
        with torch.device(device):
            return AutoModelForCausalLM.from_config(config, dtype=dtype)
    path, revision = model.path, model.revision
    assert path is not None  # a recipe gives exactly one of path and config
    if model_source.kind_of(path) == "s3":  # the agent downloads it and hands the trainer the folder instead
        raise RecipeError(f"model.path {path}: an s3:// model is read from its downloaded folder; run the trainer "
                          "through the on-box agent (python -m training.agent) or give that folder")
    config = AutoConfig.from_pretrained(path, revision=revision)
    if torch.device(device).type == "meta":  # its shape only: the weights come from another rank
        with torch.device("meta"):
            return checkpoint_class(config)._from_config(config, dtype=dtype)
    return checkpoint_class(config).from_pretrained(path, revision=revision, dtype=dtype, device_map=device)


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


def _quiet(line):
    pass


STOP = threading.Event()


class StopRequested(Exception):
    pass


class FirstRecordSays:
    """A metrics sink that adds `memory_plan` (the plan's line) to the first step record it writes: the agent posts it
    as the run's log event (training/agent/metrics.py)."""

    def __init__(self, sink, words: str):
        self.sink, self.words = sink, words

    def emit(self, record):
        if self.words:
            record, self.words = {**record, "memory_plan": self.words}, ""
        self.sink.emit(record)

    def close(self):
        self.sink.close()


def run_phase(phase):
    """Step a started (or restored) phase to its end: log every step, checkpoint at its interval, at its end and
    when a stop is asked for."""
    while not phase.done:
        started = time.monotonic()
        record = phase.train_step()
        phase.log(record)
        STOP.wait(phase.spec.min_step_seconds - (time.monotonic() - started))  # a demo's pace; a stop cuts it short
        stopping = STOP.is_set()
        if phase.checkpoint_due() or stopping:
            phase.save()
        if stopping:
            raise StopRequested(f"stopped on request at {phase.spec.name} step {phase.step}, after saving a checkpoint")
    phase.finish()


# Times a one-GPU run with `memory_plan: auto` starts again on a more frugal plan after running out of memory.
OOM_RETRIES = 2


class OutOfMemoryOnPlan(Exception):
    """The run went out of GPU memory on the plan it chose: the plan (a memory_plan.Plan), to choose below it."""

    def __init__(self, plan):
        super().__init__(f"out of GPU memory on plan {plan.name} ({plan.total_gib:.1f} of {plan.card_gib:.1f} GiB)")
        self.plan = plan


def run(recipe, out=print):
    """Run (or continue) every phase of a validated recipe (the dict `load_recipe` returns). A one-GPU run whose memory
    plan was chosen for it (`memory_plan: auto`) and that still runs out of GPU memory starts again from its last
    complete checkpoint on the next more frugal plan, up to OOM_RETRIES times, instead of ending."""
    recipe = RunRecipe.from_dict(recipe)
    under_gib = None
    for retry in range(OOM_RETRIES + 1):
        try:
            return _train(recipe, out, under_gib)
        except OutOfMemoryOnPlan as exc:
            failed = exc.plan
            if retry == OOM_RETRIES:
                raise torch.OutOfMemoryError(f"{exc}; no more frugal plan was tried after {OOM_RETRIES}") from None
        # Outside the except block: the traceback, and the model it holds, are gone before the memory is returned.
        gc.collect()
        torch.cuda.empty_cache()
        under_gib = failed.total_gib - 0.01  # whatever the next plan is, it must need less than this one did
        out(f"out of GPU memory on plan {failed.name} ({failed.total_gib:.1f} GiB predicted); starting again from the "
            f"last complete checkpoint on a plan under {under_gib:.1f} GiB")
    raise AssertionError("unreachable")


def _train(recipe, out, under_gib):
    """One attempt at the whole run, its memory plan one that needs less than `under_gib` (None: what the card has,
    less the headroom kept)."""
    ranks = distributed.join(recipe.gpus)
    if not ranks.main:
        out = _quiet  # rank 0 prints and writes the metrics for all
    # What the plan counts as usable is all the allocator may hold: the rest is the room CUDA needs beside it.
    if ranks.device.type == "cuda":
        fitting.cap_allocator(ranks.device, fitting.usable_memory_gib(ranks.device, ranks.size))
        tune_past_out_of_memory()
    base = build_model(recipe.model, ranks.build_device())  # several ranks: sent layer by layer
    vocab_size = base.config.get_text_config().vocab_size
    plain = recipe.to_dict()  # for the tokenizer's loader and phase_finals, which read its sections as plain values
    tokenizer = load_tokenizer(plain["model"], vocab_size)
    lora = recipe.lora
    model = attach_lora(base, r=lora.r, alpha=lora.alpha, attention=lora.attention, targets=lora.targets)
    # Checkpointing and the optimizer's state as the memory plan has them for this card (training/fitting.py).
    fit = fitting.choose(recipe, model, ranks.device, gpus=ranks.size, under_gib=under_gib)
    (out if fit.plan is not None else _log.info)(fit.words)  # a CPU run has no plan to say beside its steps
    fitting.checkpoint_layers(base, fit)
    fitting.cast_factors(model, fit.optimizer)
    model.train()
    # After LoRA, so that its factors are sharded and averaged (training/distributed.py); runs the experts-forward
    # guard (on several ranks: layer by layer, on every rank).
    ranks.shard(model)
    groups = parameter_groups(model)
    probe = torch.randint(3, vocab_size, (1, 16), generator=torch.Generator().manual_seed(0)).to(ranks.device)
    ranks.everywhere(functools.partial(guards.check_lora_delta_in_forward, model,
                                       lambda: model(input_ids=probe).logits))

    settings = recipe.checkpoint
    store = checkpoint.open_store(dataclasses.asdict(settings))
    uploader = ranks.uploader(model, store, settings.staging, settings.keep,
                              protected=checkpoint.phase_finals(training_phases(plain["phases"])))
    # An eval phase (the last one) is not the trainer's: the agent runs it apart (training/evaluation).
    phases = training_phases(recipe.phases)
    name, state = ranks.resume(model, store, settings.staging, functools.partial(_check_resumable, phases))
    start_phase, resumed = 0, None
    if name:
        start_phase = state["phase_index"]
        if state["step"] >= phases[start_phase].steps:
            start_phase += 1  # that phase finished; the next starts from its adapter
        else:
            resumed = state
        out(f"resuming from checkpoint {name}")

    sinks = open_sinks(dataclasses.asdict(recipe.metrics)) if ranks.main else []
    if fit.plan is not None:
        sinks = [FirstRecordSays(sink, fit.words) for sink in sinks]  # the agent posts it as the run's event
    # A micro-batch that carries host values (DeltaNet layers told their samples' ends on the host where the attention
    # is not told its rows: training/packing.py) runs eagerly; the graphs see to that (training/graphs.py).
    # Up to one graph per DPO/KTO length bucket: the graphs share one memory pool, so each more holds little beyond
    # its own inputs (training/graphs.py).
    graphs = (MicroStepGraphs(groups["trainable"], max_graphs=len(length_buckets(recipe.seq_len)))
              if ranks.device.type == "cuda" and recipe.cuda_graphs and ranks.can_capture else None)
    router = router_load.attach_counter(model, ranks.device) if recipe.metrics.router_every else None
    trainee = Trainee(model, groups, ranks, graphs, recipe.max_grad_norm, router=router, optimizer=fit.optimizer)
    try:
        # Gradients reach .grad through backward() only and nothing hooks them: the experts' backward may add the
        # routed LoRA gradients into .grad itself.
        with moe_lora.grads_accumulated_in_place(model):
            for index in range(start_phase, len(phases)):
                phase = Phase(recipe, index, trainee, tokenizer, sinks, uploader, out)
                if resumed is not None and resumed["phase_index"] == index:
                    phase.restore(resumed)
                else:
                    phase.start()
                run_phase(phase)
    except RuntimeError as exc:  # torch.OutOfMemoryError is one, and so is CUDA's own as a Triton launch says it
        if not is_out_of_memory(exc) or not retriable(recipe, fit, ranks):
            raise
        raise OutOfMemoryOnPlan(fit.plan) from None  # the traceback and what it holds are let go
    finally:
        uploader.wait()  # also when stopped on request: the last checkpoint must reach the store
        for sink in sinks:
            sink.close()
        ranks.leave()
    out("run complete" if start_phase < len(phases) else "run already complete; nothing to do")
    return model


def retriable(recipe, fit, ranks) -> bool:
    """Whether running out of memory may be met with a more frugal plan: one GPU, a plan the trainer chose for the
    memory it found (not the recipe's own settings), and a plan below it to choose."""
    return ranks.size == 1 and recipe.memory_plan == "auto" and fit.plan is not None and fit.plan.fits


def training_phases(phases):
    """The phases the trainer trains: every one but the eval phase, which comes last (training/recipe.py)."""
    return [phase for phase in phases if (phase["kind"] if isinstance(phase, dict) else phase.kind) != EVAL_KIND]


def _check_resumable(phases, name, state):
    """A checkpoint this recipe can resume from: its phase is the recipe's phase at that position."""
    index = state["phase_index"]
    if index >= len(phases) or phases[index].name != state["phase_name"]:
        raise RecipeError(f"checkpoint {name} is from phase {state['phase_name']!r}, which this recipe does not "
                          f"have at position {index}; use the recipe the run started with or another "
                          "checkpoint.store")


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
        print(f"{trainer_exits.RECIPE_ERROR_MARK}{exc}", file=sys.stderr, flush=True)
        return trainer_exits.RECIPE_ERROR_EXIT
    except guards.GuardError as exc:
        print(f"{trainer_exits.GUARD_MARK}{exc}", file=sys.stderr, flush=True)
        return trainer_exits.GUARD_EXIT
    except StopRequested as exc:
        print(str(exc), flush=True)
        return trainer_exits.STOPPED_EXIT
    return 0


if __name__ == "__main__":
    sys.exit(main())
