"""`python -m training.evaluation --recipe R --samples S [--done D] [--summary M]`: the eval phase as a process. It
answers each record not done (in D or S) with the last training phase's final adapter and without it, scores both,
appends each sample to S as a JSON line, then writes M. Exit 2 on a recipe, record or scorer error."""

import argparse
import json
import logging
import os
import sys
from pathlib import Path

import torch
from peft import set_peft_model_state_dict

from training import checkpoint
from training.checkpoint_names import MARKER, checkpoint_name
from training.lora import attach_lora
from training.records import load_tokenizer, read_records
from training.out_of_memory import tune_past_out_of_memory
from training.recipe import EVAL_KIND, ModelSettings, RecipeError, load_recipe
from training.train import build_model

from .generate import Timed, TransformersGenerator, VllmGenerator, prompt_ids, vllm_available
from .scorers import Scorer, ScoreError, record_problem

_log = logging.getLogger("training.evaluation")


class EvalError(ValueError):
    """The eval phase cannot run as its recipe says: the message says why."""


def eval_phase(recipe: dict) -> tuple[int, dict, dict]:
    """(index, the eval phase, the last training phase) of a validated recipe."""
    phases = recipe["phases"]
    if not phases or phases[-1]["kind"] != EVAL_KIND or len(phases) < 2:
        raise EvalError("the recipe has no eval phase after its training phases")
    return len(phases) - 1, phases[-1], phases[-2]


def eval_records(phase: dict, scorer: str) -> list[dict]:
    """The phase's records (the first max_samples of them), each one checked for its scorer."""
    records = read_records(phase["data"], EVAL_KIND)
    if phase["max_samples"]:
        records = records[:phase["max_samples"]]
    for index, record in enumerate(records):
        if problem := record_problem(scorer, record):
            raise EvalError(f"{phase['data']}: record {index + 1}: {problem}")
    return records


def shown_prompt(prompt) -> str:
    """A prompt as the results table shows it: the text, or each message as 'role: content'."""
    if isinstance(prompt, str):
        return prompt
    return "\n".join(f"{m['role']}: {_content(m.get('content'))}"
                     + "".join(f"\n{json.dumps(call, sort_keys=True)}" for call in m.get("tool_calls") or [])
                     for m in prompt)


def _content(content) -> str:
    return content if isinstance(content, str) else "".join(p["text"] for p in content or [])


def shown_expected(record: dict) -> str:
    expected = record.get("expected", record.get("reference"))
    return expected if isinstance(expected, str) else json.dumps(expected, sort_keys=True) if expected else ""


def samples_done(path: Path) -> set[int]:
    """The indices already written to the samples file; a half-written last line (a child killed as it wrote) is
    cut off, so that the next sample starts a line of its own."""
    if not path.exists():
        return set()
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        data = data[: data.rfind(b"\n") + 1]
        with open(path, "r+b") as f:
            f.truncate(len(data))
    done = set()
    for line in data.splitlines(keepends=True):
        try:
            done.add(int(json.loads(line)["index"]))
        except (ValueError, KeyError, TypeError):
            continue
    return done


def final_adapter(recipe: dict, index: int, steps: int, workdir: Path) -> tuple[dict, Path]:
    """(adapter state dict, its checkpoint folder here) of the phase's final checkpoint, from the run's store."""
    name = checkpoint_name(index, steps)
    store = checkpoint.open_store(recipe["checkpoint"])
    if not store.names().get(name):
        raise EvalError(f"the final checkpoint {name} of the last training phase is not complete in the store")
    local = workdir / "adapter"
    adapter, _ = checkpoint.load(store, name, local)
    if not (local / MARKER).exists():
        raise EvalError(f"checkpoint {name} lost its completion marker")
    return adapter, local


def transformers_generator(recipe: dict, adapter: dict, tokenizer_out: list):
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        tune_past_out_of_memory()  # the model fills most of the card, as in training (training/out_of_memory.py)
    settings = ModelSettings(**recipe["model"])
    base = build_model(settings, device)
    tokenizer = load_tokenizer(recipe["model"], base.config.get_text_config().vocab_size)
    lora = recipe["lora"]
    model = attach_lora(base, r=lora["r"], alpha=lora["alpha"], attention=lora["attention"], targets=lora["targets"])
    set_peft_model_state_dict(model, {k: v.to(device) for k, v in adapter.items()})
    model.eval()
    tokenizer_out.append(tokenizer)
    return TransformersGenerator(model, tokenizer, device)


def generator_for(recipe: dict, adapter: dict, folder: Path, prompts: list, max_new_tokens: int):
    """vLLM where it imports and the model is a folder with the adapter's vLLM export (its context the longest prompt
    and answer, rounded up); transformers otherwise, or when vLLM does not start (said in the log)."""
    model = recipe["model"]
    if vllm_available() and model.get("path") and Path(model["path"]).is_dir() and (folder / "vllm").is_dir():
        tokenizer = load_tokenizer(model, 0)
        longest = max(len(prompt_ids(tokenizer, *prompt)) for prompt in prompts) + max_new_tokens
        try:
            return VllmGenerator(model["path"], str(folder / "vllm"), recipe["lora"]["r"], tokenizer,
                                 model["dtype"], int(recipe.get("gpus") or 1), -(-longest // 256) * 256), tokenizer
        except Exception as exc:  # noqa: BLE001 - vLLM's own failure to start: transformers answers instead
            _log.warning("vLLM did not start (%s: %s); generating with transformers", type(exc).__name__,
                         str(exc)[:500])
    out: list = []
    generator = transformers_generator(recipe, adapter, out)
    return generator, out[0]


def evaluate(recipe: dict, samples: Path, done: set[int], workdir: Path) -> dict:
    """Answers, scores and writes every sample not in `done` or the samples file; returns the summary."""
    index, phase, last = eval_phase(recipe)
    scorer = Scorer(phase["scorer"])
    records = eval_records(phase, phase["scorer"])
    done = done | samples_done(samples)
    pending = [i for i in range(len(records)) if i not in done]
    summary = {"phase": index, "samples": len(records), "generated_with": "transformers", "tokens_per_s": 0.0}
    if not pending:
        return summary
    adapter, folder = final_adapter(recipe, index - 1, last["steps"], workdir)
    generator, tokenizer = generator_for(recipe, adapter, folder,
                                         [(records[i]["prompt"], records[i].get("tools")) for i in pending],
                                         phase["max_new_tokens"])
    timed = Timed(generator)
    size = phase["batch_size"]
    with open(samples, "a", encoding="utf-8") as out:
        for start in range(0, len(pending), size):
            batch = pending[start:start + size]
            prompts = [prompt_ids(tokenizer, records[i]["prompt"], records[i].get("tools")) for i in batch]
            tuned = timed.generate(prompts, phase["max_new_tokens"], adapter=True)
            base = timed.generate(prompts, phase["max_new_tokens"], adapter=False)
            for i, (adapter_answer, _), (base_answer, _) in zip(batch, tuned, base, strict=True):
                record = records[i]
                try:
                    scores = [scorer.score(record["prompt"], said, record) for said in (base_answer, adapter_answer)]
                except ScoreError as exc:
                    raise ScoreError(f"record {i + 1}: {exc}") from exc
                out.write(json.dumps({
                    "index": i, "prompt": shown_prompt(record["prompt"]), "expected": shown_expected(record),
                    "base_answer": base_answer, "adapter_answer": adapter_answer,
                    "base_score": scores[0], "adapter_score": scores[1]}) + "\n")
            out.flush()
            os.fsync(out.fileno())
            print(f"eval: {min(start + size, len(pending))}/{len(pending)} samples", flush=True)
    generator.close()
    return {**summary, "generated_with": generator.name, "tokens_per_s": round(timed.tokens_per_s, 3)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.evaluation", description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", required=True, help="the run's recipe (YAML or JSON), its last phase of kind eval")
    parser.add_argument("--samples", required=True, help="the JSONL file each finished sample is appended to")
    parser.add_argument("--done", default="", help="a JSON file of sample indices already recorded, skipped")
    parser.add_argument("--summary", default="", help="where to write {generated_with, tokens_per_s} at the end")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        done = set(json.loads(Path(args.done).read_text())) if args.done else set()
        samples = Path(args.samples)
        summary = evaluate(load_recipe(args.recipe), samples, done, samples.parent)
    except (RecipeError, EvalError, ScoreError, ValueError) as exc:
        print(f"evaluation error: {exc}", file=sys.stderr, flush=True)
        return 2
    if args.summary:
        Path(args.summary).write_text(json.dumps(summary))
    print(f"evaluation complete: {summary['samples']} samples, {summary['generated_with']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
