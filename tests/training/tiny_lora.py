"""The tests' tiny model with the trainer's LoRA attached, the routed B factors random (not zero) so that the routed
LoRA changes what the model computes."""

import torch

from training.lora import attach_lora, randomize_routed_lora_b


def tiny_lora_model(config):
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = dict(config)
    torch.manual_seed(0)
    model = attach_lora(AutoModelForCausalLM.from_config(AutoConfig.for_model(fields.pop("model_type"), **fields)),
                        r=4, alpha=8).float()
    randomize_routed_lora_b(model, std=0.1, generator=torch.Generator().manual_seed(0))
    return model
