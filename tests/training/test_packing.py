"""Packed rows keep their samples apart: each sample's logits (and so its loss) in a packed batch are those of the
sample alone, for attention (Qwen3-MoE) and for Gated DeltaNet (Qwen3.5-MoE)."""

import pytest
import torch

from training.data import IGNORE, _pack, collate
from training.examples.tiny import TINY_CONFIG, TINY_QWEN3_5_CONFIG
from training.lora import attach_lora, randomize_routed_lora_b
from training.losses import causal_lm_loss
from training.packing import model_inputs

SEQ_LEN = 24


def _model(config):
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = dict(config)
    torch.manual_seed(0)
    model = attach_lora(AutoModelForCausalLM.from_config(AutoConfig.for_model(fields.pop("model_type"), **fields)),
                        r=4, alpha=8).float()
    randomize_routed_lora_b(model, std=0.1, generator=torch.Generator().manual_seed(0))
    return model


def _samples():
    generator = torch.Generator().manual_seed(3)
    return [torch.randint(3, 260, (n,), generator=generator).tolist() for n in (7, 5, 9, 11, 6, 30)]


@pytest.mark.parametrize("config", [TINY_CONFIG, TINY_QWEN3_5_CONFIG], ids=["qwen3_moe", "qwen3_5_moe"])
def test_each_sample_in_a_packed_batch_scores_as_it_does_alone(config):
    model = _model(config)
    samples = _samples()
    rows = _pack([(ids, list(ids)) for ids in samples], SEQ_LEN, pad_id=0)
    batch = collate("cpt", rows, pad_id=0)
    assert batch["input_ids"].shape[0] < len(samples)  # several samples share a row
    with torch.no_grad():
        packed = model(**model_inputs(model, batch)).logits
        unpacked = model(input_ids=batch["input_ids"], use_cache=False).logits
        # Where each sample sits: its row and first column, found by its tokens.
        place, losses = {}, []
        for row, positions in enumerate(batch["position_ids"].tolist()):
            for column, position in enumerate(positions):
                if position == 0:
                    place.setdefault(row, []).append(column)
        placed = [(row, column) for row in sorted(place) for column in place[row]]
        for ids in samples:
            for start in range(0, len(ids), SEQ_LEN):
                piece = ids[start:start + SEQ_LEN]
                row, column = next((r, c) for r, c in placed
                                   if batch["input_ids"][r, c:c + len(piece)].tolist() == piece)
                alone = model(input_ids=torch.tensor([piece]), use_cache=False).logits[0]
                torch.testing.assert_close(packed[row, column:column + len(piece)], alone, rtol=1e-5, atol=1e-5)
                if column:  # the same rows run as one stream let the earlier samples in: the test can tell
                    losses.append((unpacked[row, column:column + len(piece)] - alone).abs().max())
    assert losses and max(losses) > 1e-3


def test_the_packed_loss_is_the_token_mean_of_the_samples_losses_alone():
    model = _model(TINY_QWEN3_5_CONFIG)
    samples = _samples()[:3]
    batch = collate("cpt", _pack([(ids, list(ids)) for ids in samples], SEQ_LEN, pad_id=0), pad_id=0)
    with torch.no_grad():
        packed, _ = causal_lm_loss(model, batch, {"kind": "cpt"}, {})
        total, count = 0.0, 0
        for ids in samples:
            x = torch.tensor([ids])
            loss, _ = causal_lm_loss(model, {"input_ids": x, "labels": x}, {"kind": "cpt"}, {})
            total, count = total + float(loss) * (len(ids) - 1), count + len(ids) - 1
    assert float(packed) == pytest.approx(total / count, rel=1e-5)


def test_packing_keeps_samples_whole_and_their_first_token_out_of_the_loss():
    rows = _pack([([5] * 10, [5] * 10), ([6] * 10, [6] * 10), ([7] * 30, [7] * 30)], 24, pad_id=0)
    assert [r["input_ids"].count(6) for r in rows] == [10, 0, 0]  # 5s and 6s share a row; 7s do not fit
    assert rows[0]["position_ids"] == list(range(10)) * 2 + list(range(4))
    assert rows[0]["labels"][0] == rows[0]["labels"][10] == IGNORE and rows[0]["labels"][20:] == [IGNORE] * 4
    assert rows[1]["input_ids"] == [7] * 24 and rows[2]["input_ids"][:6] == [7] * 6  # cut into seq_len pieces
    assert rows[2]["position_ids"][:6] == list(range(6))
