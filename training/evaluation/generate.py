"""Greedy answers to an eval phase's prompts, with the adapter and with it off (the base model), on the same
prompts: through vLLM's offline engine where the box has it, else transformers with the trainer's experts backend,
batched and left-padded (docs/training.md, "The eval phase")."""

import importlib.util
import json
import logging
import time
from collections import OrderedDict
from contextlib import contextmanager, nullcontext

import torch

from training import rollout
from training.records import encode, openai_messages

_log = logging.getLogger(__name__)
VLLM_LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)  # the max_lora_rank values vLLM accepts
_BASE_DECODERS = "_eval_base_decoders"  # the base's decoders, kept apart while the adapter's are in use


def prompt_ids(tokenizer, prompt, tools=None) -> list[int]:
    """A record's prompt as the model reads it: its chat template with the record's tools and the generation prompt
    (a text prompt is the user's message); a tokenizer without a template reads plain turns, the tools first."""
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else openai_messages(prompt)
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=True, add_generation_prompt=True)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    head = f"<|tools|>\n{json.dumps(tools, sort_keys=True)}\n" if tools else ""
    turns = "".join(f"<|{m['role']}|>\n{m.get('content') or ''}\n" for m in messages)
    return encode(tokenizer, head + turns + "<|assistant|>\n")


def answer_text(tokenizer, tokens: list[int]) -> tuple[str, int]:
    """(the text, the tokens generated) of one completion: up to its first end-of-sequence token, special tokens
    written out (Qwen3's <tool_call> is one)."""
    eos = tokenizer.eos_token_id
    if eos in tokens:
        end = tokens.index(eos)
        return tokenizer.decode(tokens[:end], skip_special_tokens=False), end + 1
    return tokenizer.decode(tokens, skip_special_tokens=False), len(tokens)


@contextmanager
def adapter_off(model):
    """Within it the model computes as its base: peft's adapter layers disabled (the routed experts' forward reads
    the same flag, training/moe_lora.lora_factors), and the decoders kept for the base apart from the adapter's (a
    captured decode step replays whichever forward it captured)."""
    causal = model.get_base_model()
    kept = causal.__dict__.get(rollout.DECODERS_ATTRIBUTE, OrderedDict())
    causal.__dict__[rollout.DECODERS_ATTRIBUTE] = causal.__dict__.pop(_BASE_DECODERS, OrderedDict())
    try:
        with model.disable_adapter():
            yield
    finally:
        causal.__dict__[_BASE_DECODERS] = causal.__dict__.get(rollout.DECODERS_ATTRIBUTE, OrderedDict())
        causal.__dict__[rollout.DECODERS_ATTRIBUTE] = kept


class TransformersGenerator:
    """The trainer's model (a PeftModel with the adapter loaded), answering greedily; `generate` gives each prompt's
    (text, tokens generated)."""

    name = "transformers"

    def __init__(self, model, tokenizer, device):
        self.model, self.tokenizer, self.device = model, tokenizer, device

    def generate(self, prompts: list[list[int]], max_new_tokens: int, *, adapter: bool) -> list[tuple[str, int]]:
        pad = self.tokenizer.pad_token_id
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), pad, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):  # left-padded: every prompt ends where generation starts
            ids[row, width - len(prompt):] = torch.tensor(prompt)
            mask[row, width - len(prompt):] = 1
        with nullcontext() if adapter else adapter_off(self.model):
            out = rollout.sample(self.model, ids.to(self.device), mask.to(self.device), max_new_tokens, 0.0,
                                 self.tokenizer.eos_token_id, pad)
        return [answer_text(self.tokenizer, row) for row in out.tolist()]

    def close(self):
        """Drops the decoders (caches and CUDA graphs) of both ways."""
        self.model.get_base_model().__dict__.pop(_BASE_DECODERS, None)
        rollout.release(self.model)


class VllmGenerator:
    """vLLM's offline engine on the base model's folder, the adapter (the final checkpoint's `vllm/` export) as a
    LoRA request; the base is the same engine without it."""

    name = "vllm"

    def __init__(self, model_path: str, adapter_dir: str, rank: int, tokenizer, dtype: str, gpus: int,
                 max_model_len: int):
        from vllm import LLM  # only where vllm imports (`vllm_available`)
        from vllm.lora.request import LoRARequest

        self.tokenizer = tokenizer
        max_rank = next((r for r in VLLM_LORA_RANKS if r >= rank), rank)
        self.llm = LLM(model=model_path, tokenizer=model_path, dtype=dtype, tensor_parallel_size=gpus, seed=0,
                       enable_lora=True, max_lora_rank=max_rank, max_loras=1, max_model_len=max_model_len)
        self.lora = LoRARequest("adapter", 1, adapter_dir)

    def generate(self, prompts: list[list[int]], max_new_tokens: int, *, adapter: bool) -> list[tuple[str, int]]:
        from vllm import SamplingParams

        params = SamplingParams(temperature=0.0, max_tokens=max_new_tokens, detokenize=False)
        outs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], params,
                                 lora_request=self.lora if adapter else None, use_tqdm=False)
        return [answer_text(self.tokenizer, list(out.outputs[0].token_ids)) for out in outs]

    def close(self):
        del self.llm


def vllm_available() -> bool:
    """Whether this box can generate through vLLM: it imports, and there is a GPU."""
    return importlib.util.find_spec("vllm") is not None and torch.cuda.is_available()


class Timed:
    """A generator's tokens per second over every call (both answers of each prompt)."""

    def __init__(self, generator):
        self.generator, self.tokens, self.seconds = generator, 0, 0.0

    def generate(self, prompts, max_new_tokens, *, adapter):
        started = time.monotonic()
        answers = self.generator.generate(prompts, max_new_tokens, adapter=adapter)
        self.seconds += time.monotonic() - started
        self.tokens += sum(n for _, n in answers)
        return answers

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0
