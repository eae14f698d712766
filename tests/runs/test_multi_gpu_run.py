"""A run of the tiny model on two GPUs, end to end on the simulated marketplace over real HTTP: the supervisor rents a
two-GPU box for it, the box's agent starts the trainer's two ranks (torchrun, gloo on the CPU), and the run finishes
with sharded checkpoints from both ranks and one adapter, nothing left billing."""

import re
from decimal import Decimal

import pytest

from fleet.models import Instance, Offer, OfferProfile
from fleet.offers.refresh import refresh_offers
from fleet.ranking import OfferFilters, Workload
from runs.launch import launch
from tests.marketplace import boxes_reporting_to

from .conftest import tiny_recipe
from .test_end_to_end import _drive, beat  # noqa: F401  (beat: a fixture)

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def boxes(tmp_path, settings, live_server):
    settings.RENT_OUTCOME_GRACE_S = settings.DESTROY_VERIFY_S = 5
    # Two ranks, an agent and a server on a loaded 2-core machine.
    with boxes_reporting_to(live_server.url, settings, tmp_path / "boxes", heartbeat_timeout_s=30) as found:
        yield found


# The whole way on the simulated marketplace: a 2-GPU box rented for the profile, the trainer's ranks started by
# torchrun on its CPU (gloo), every rank's checkpoint shard and one adapter uploaded, the run finished and its box
# destroyed.
def test_a_run_on_two_gpus_rents_a_two_gpu_box_and_trains_on_both(boxes, beat, tmp_path):  # noqa: F811
    market, agents = boxes
    profile = OfferProfile.objects.create(name="two-gpus", recipe=Workload(gpus=2).to_dict(),
                                          filters=OfferFilters(max_usd_per_hour=Decimal("6")).to_dict())
    phases = [dict(p, steps=3) for p in tiny_recipe()["phases"] if p["kind"] in ("cpt", "sft")]
    run = launch(name="two-gpus", recipe=tiny_recipe(phases=phases, gpus=2), bucket=str(tmp_path / "bucket"),
                 budget_usd=Decimal("20"), max_restarts=2, profile=profile)

    run = _drive(run, until=lambda r: not r.is_active, timeout_s=170)
    story = "\n".join(f"{e.kind}: {e.message[:200]}" for e in run.events.order_by("at", "id"))
    assert run.state == "finished", story
    box = run.attempts.last().instance
    offer = Offer.objects.get(provider="vast", offer_id=box.offer_id, is_bid=False)
    assert (box.num_gpus, offer.num_gpus) == (2, 2) and offer.nvlink_gb_s > 0, story
    assert re.search(r"Rented \S+: offer \d+, 2x ", story)

    for phase in range(2):
        steps = list(run.metrics.filter(phase=phase).order_by("step").values_list("step", flat=True))
        assert steps == [1, 2, 3], (phase, steps)
    final = run.checkpoints.filter(complete=True).order_by("phase", "step").last()
    files = set(final.manifest)
    assert {"rng-0.pt", "rng-1.pt"} <= {name.rsplit("/", 1)[-1] for name in files}, sorted(files)  # both ranks
    assert sum(name.endswith("adapter_model.safetensors") and name.startswith("adapter/") for name in files) == 1
    trainer_log = (agents.folder(int(box.provider_instance_id)) / "work" / "trainer.log").read_text()
    assert "run complete" in trainer_log

    _drive(run, until=lambda r: not Instance.objects.filter(state__in=Instance.LIVE_STATES).exists(), timeout_s=30)


# A run that says gpus: 2 is ranked for two GPUs of one box whatever its profile says (a one-GPU box would stop its
# trainer at once), and without a profile the default price cap, a one-GPU box's, counts per GPU.
def test_a_run_on_two_gpus_without_a_profile_is_put_on_a_two_gpu_box(market, tmp_path):
    from runs.supervisor import supervise

    refresh_offers()
    phases = [dict(p, steps=3) for p in tiny_recipe()["phases"] if p["kind"] == "cpt"]
    run = launch(name="two-gpus", recipe=tiny_recipe(phases=phases, gpus=2), bucket=str(tmp_path / "bucket"),
                 budget_usd=Decimal("20"), max_restarts=0)
    supervise()
    run.refresh_from_db()
    assert run.current_instance is not None, [e.message for e in run.events.all()]
    assert run.current_instance.num_gpus == 2
