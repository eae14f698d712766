"""The routed-expert adapter is a standard peft adapter: plain peft loads it onto the base model, same logits."""

import copy
import json

import torch
from peft import PeftModel

from training.lora import attach_lora, randomize_routed_lora_b


def test_it_saves_an_adapter_that_peft_loads_onto_the_base_model_with_the_same_logits(tiny_model, tokens, tmp_path):
    base_copy = copy.deepcopy(tiny_model)
    model = attach_lora(tiny_model, r=4, alpha=8)
    randomize_routed_lora_b(model, std=0.1, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "q_proj.lora_B" in name:
                param.normal_(0, 0.1)
    ours = model(input_ids=tokens).logits
    model.save_pretrained(tmp_path)

    config = json.loads((tmp_path / "adapter_config.json").read_text())
    assert sorted(config["target_parameters"]) == ["experts.down_proj", "experts.gate_up_proj"]
    served = PeftModel.from_pretrained(base_copy, tmp_path)
    assert served.get_base_model().config._experts_implementation != "moe_lora"
    theirs = served(input_ids=tokens).logits

    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    with served.disable_adapter():
        plain = served(input_ids=tokens).logits
    assert (plain - ours).abs().max() > 1e-3, "the adapter must change the logits for this test to mean anything"
