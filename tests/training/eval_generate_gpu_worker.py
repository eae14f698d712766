"""The eval phase's generation on a GPU, outside pytest's Triton interpreter (tests/training/test_eval_generate_gpu.py
starts it): the tiny model in bfloat16 on the experts' Triton path, decode steps replayed from CUDA graphs. Prints
one JSON line of the answers each way."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch

from tests.training.tiny_eval_run import CONFIG
from tests.training.tiny_lora import tiny_lora_model
from training.evaluation.generate import TransformersGenerator, prompt_ids
from training.lora import routed_lora_wrappers
from training.records import ByteTokenizer

PROMPTS = ["43 + 42 =", "Name the capital of France, please.", "hi", "What is 28 plus 38?"]


def main():
    device = torch.device("cuda")
    model = tiny_lora_model(CONFIG).to(device, torch.bfloat16).eval()
    tokenizer = ByteTokenizer(CONFIG["vocab_size"])
    generator = TransformersGenerator(model, tokenizer, device)
    prompts = [prompt_ids(tokenizer, p) for p in PROMPTS]
    answers = {}
    for name in ("tuned", "base", "tuned_again", "base_again"):  # each way twice: the graphs must not mix
        answers[name] = generator.generate(prompts, 24, adapter=name.startswith("tuned"))
    with torch.no_grad():
        for _, _, wrapper in routed_lora_wrappers(model):
            for layer in wrapper.lora_B.values():
                layer.weight.zero_()
    generator.close()  # the graphs captured the old factors' addresses only; new graphs for the zeroed adapter
    answers["zero_tuned"] = generator.generate(prompts, 24, adapter=True)
    answers["graphs"] = len(model.get_base_model().__dict__.get("_rollout_decoders", {}))
    print(json.dumps(answers))


if __name__ == "__main__":
    main()
