"""The three guards: each passes on a healthy tiny model and fires on the failure it exists for."""

import itertools

import pytest
import torch
from transformers.integrations.moe import ExpertsInterface

from training import guards, moe_lora
from training.lora import attach_lora


@pytest.fixture
def model(tiny_model):
    return attach_lora(tiny_model, r=4, alpha=8)


def _loss(model, tokens):
    return lambda: model(input_ids=tokens, labels=tokens).loss


def _logits(model, tokens):
    return lambda: model(input_ids=tokens).logits


def test_it_passes_all_three_guards_on_a_healthy_model(model, tokens):
    guards.check_experts_forward_is_ours(model)
    guards.check_lora_delta_in_forward(model, _logits(model, tokens))
    model(input_ids=tokens, labels=tokens).loss.backward()
    norms = guards.check_routed_lora_grads(model)
    # B starts at zero: at step 1 only B gets a gradient, and that is healthy.
    assert all(v for k, v in norms.items() if ".lora_B." in k)
    assert all(not v for k, v in norms.items() if ".lora_A." in k)


def test_it_passes_the_gradient_guard_when_both_factors_learn(model, tokens):
    from training.lora import randomize_routed_lora_b

    randomize_routed_lora_b(model, generator=torch.Generator().manual_seed(0))
    model(input_ids=tokens, labels=tokens).loss.backward()
    norms = guards.check_routed_lora_grads(model)
    assert all(norms.values())


def test_it_refuses_to_start_when_an_import_swapped_the_experts_forward(model, monkeypatch):
    experts_cls = type(model.get_base_model().model.layers[0].mlp.experts.get_base_layer())
    # What a patching library does: put its own forward on the class (here transformers' eager loop).
    monkeypatch.setattr(experts_cls, "forward", experts_cls.forward.__wrapped__)
    with pytest.raises(guards.ExpertsForwardReplaced, match="did not run"):
        guards.check_experts_forward_is_ours(model)


def test_it_refuses_to_start_when_the_model_runs_another_experts_implementation(model):
    model.get_base_model().set_experts_implementation("eager")
    with pytest.raises(guards.ExpertsForwardReplaced, match="'eager'"):
        guards.check_experts_forward_is_ours(model)


def test_it_refuses_to_start_when_the_routed_lora_delta_is_not_in_the_forward(model, tokens):
    for _, _, wrapper in guards.routed_lora_wrappers(model):
        wrapper.scaling["default"] = 0.0
    with pytest.raises(guards.LoraDeltaMissing):
        guards.check_lora_delta_in_forward(model, _logits(model, tokens))


def test_it_passes_a_healthy_model_whose_loss_barely_moves(model, tokens):
    """A small random model's loss sits near log(vocabulary): B's noise once moved it by under a millionth, and the
    guard, then on the loss, aborted a healthy run. Its logits move."""
    model.get_base_model().lm_head.weight.data.mul_(1e-5)
    with pytest.raises(guards.LoraDeltaMissing):  # read on the loss, as it was: a healthy run aborted
        guards.check_lora_delta_in_forward(model, _loss(model, tokens))
    guards.check_lora_delta_in_forward(model, _logits(model, tokens))  # read on the logits: it starts


def test_a_delta_no_larger_than_the_forwards_own_run_to_run_noise_does_not_count(model, tokens):
    """A forward whose output differs from run to run (kernels that add in no fixed order) must move by more than
    that for the delta to count: here the jitter drowns it."""
    logits, runs = _logits(model, tokens), itertools.count()
    with pytest.raises(guards.LoraDeltaMissing, match="a second run as it was: 100"):
        guards.check_lora_delta_in_forward(model, lambda: logits() + 100.0 * next(runs))


def test_it_restores_lora_b_after_the_delta_check(model, tokens):
    guards.check_lora_delta_in_forward(model, _logits(model, tokens))
    assert all(not bool(p.ne(0).any()) for n, p in guards.routed_lora_parameters(model).items() if ".lora_B." in n)


def test_it_aborts_at_step_one_when_the_experts_are_detached_even_though_attention_learns(model, tokens, monkeypatch):
    def detached(self, hidden_states, top_k_index, top_k_weights):
        return moe_lora.moe_lora_experts_forward(self, hidden_states, top_k_index, top_k_weights).detach()

    monkeypatch.setitem(ExpertsInterface._global_mapping, moe_lora.IMPLEMENTATION_NAME, detached)
    model(input_ids=tokens, labels=tokens).loss.backward()
    attention = [p for n, p in model.named_parameters() if "q_proj.lora_B" in n]
    assert attention and all(p.grad is not None and p.grad.norm() > 0 for p in attention)
    with pytest.raises(guards.RoutedLoraNoGradient, match="routed-expert LoRA"):
        guards.check_routed_lora_grads(model)
