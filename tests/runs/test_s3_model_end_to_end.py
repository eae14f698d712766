"""A run whose base model is an s3:// folder (moto's server, on loopback), end to end on the simulated marketplace over
real HTTP: the real agent reads the model's grant from the live dashboard's /spec, downloads every file of the
folder (config, safetensors shards, tokenizer) through its presigned GETs, and the real trainer trains on it to
the run's adapter."""

from decimal import Decimal
from pathlib import Path

import pytest

from fleet.models import Instance
from runs.launch import launch
from tests.marketplace import boxes_reporting_to
from training import model_source

from .conftest import tiny_recipe
from .test_end_to_end import _drive, beat  # noqa: F401  (beat: a fixture)
from .test_storage_s3 import BUCKET, s3  # noqa: F401  (s3: a fixture)

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
PREFIX = "models/tiny-qwen3-moe/"


def tiny_model_folder(folder: Path) -> dict[str, int]:
    """The example recipe's tiny Qwen3-MoE, its random weights saved in several safetensors shards beside a byte-level
    tokenizer, as a model's folder is stored; {file name: size}."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

    fields = dict(tiny_recipe()["model"]["config"])
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    torch.manual_seed(0)  # the same weights every run: a draw the trainer's guards refuse would fail it by chance
    AutoModelForCausalLM.from_config(config).save_pretrained(folder, max_shard_size="40KB")
    vocab = {char: index for index, char in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab["<|endoftext|>"] = len(vocab)  # 257 tokens, inside the model's 260
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|endoftext|>",
                            pad_token="<|endoftext|>").save_pretrained(folder)
    return {p.relative_to(folder).as_posix(): p.stat().st_size for p in folder.rglob("*") if p.is_file()}


@pytest.fixture
def boxes(tmp_path, settings, live_server):
    settings.RENT_OUTCOME_GRACE_S = settings.DESTROY_VERIFY_S = 5
    # An agent, a trainer, S3 and a server on a loaded 2-core machine.
    with boxes_reporting_to(live_server.url, settings, tmp_path / "boxes", heartbeat_timeout_s=30) as found:
        yield found


def test_a_run_trains_on_an_s3_model_the_box_downloads_through_its_grant(s3, boxes, beat, tmp_path):  # noqa: F811
    market, agents = boxes
    files = tiny_model_folder(tmp_path / "saved")
    assert sum(name.endswith(".safetensors") for name in files) >= 2 and "tokenizer.json" in files
    for name in files:
        s3.upload_file(str(tmp_path / "saved" / name), BUCKET, PREFIX + name)
    uri = f"s3://{BUCKET}/{PREFIX.rstrip('/')}"
    phases = [dict(p, steps=3) for p in tiny_recipe()["phases"] if p["kind"] in ("cpt", "sft")]
    run = launch(name="s3-model", recipe=tiny_recipe(model={"path": uri, "dtype": "float32"}, phases=phases),
                 bucket=str(tmp_path / "bucket"), budget_usd=Decimal("20"), max_restarts=1)
    try:
        run = _drive(run, until=lambda r: not r.is_active, timeout_s=240)
        story = "\n".join(f"{e.kind}: {e.message[:300]}" for e in run.events.order_by("at", "id"))
        assert run.state == "finished", story
        assert f"The model {uri} is on the box's disk" in story

        # The box's copy is the folder's every file, byte for byte, and the trainer loaded it from there.
        box = run.attempts.get().instance
        work = agents.folder(int(box.provider_instance_id)) / "work"
        copy = work / "model" / model_source.folder_name(uri)
        assert {name: (copy / name).read_bytes() for name in files} == {
            name: (tmp_path / "saved" / name).read_bytes() for name in files}
        assert "run complete" in (work / "trainer.log").read_text()
        for phase in range(2):
            assert list(run.metrics.filter(phase=phase).order_by("step").values_list("step", flat=True)) == [1, 2, 3]
        final = run.checkpoints.filter(complete=True).order_by("phase", "step").last()
        assert (final.phase, final.step) == (1, 3)
        assert any(n.startswith("adapter/") and n.endswith("adapter_model.safetensors") for n in final.manifest)
        _drive(run, until=lambda r: not Instance.objects.filter(state__in=Instance.LIVE_STATES).exists(), timeout_s=30)
    finally:
        for name in files:
            s3.delete_object(Bucket=BUCKET, Key=PREFIX + name)
