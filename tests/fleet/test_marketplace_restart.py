"""The simulated marketplace restarted under a live fleet (as `manage.py up` restarts it, over real HTTP): the sync
finds the same boxes under the same ids, a serving replica still counts, and no ended row's price or history moves."""

import contextlib

import pytest

from fleet import actions
from fleet.inference import replicas
from fleet.models import Alert, InferenceModel, Instance
from fleet.offers.refresh import refresh_offers
from fleet.providers.registry import get_provider
from fleet.simulator import SimulatedMarketplace
from tests.marketplace import MARKET_KEY

pytestmark = pytest.mark.django_db
State = Instance.State


@contextlib.contextmanager
def marketplace(state_file, settings):
    """The marketplace kept in `state_file`, frozen but for advance(), with the product pointed at it."""
    with SimulatedMarketplace(api_key=MARKET_KEY, seed=7, speed=0, boot_delay_s=90, port=0,
                              charges_min_interval_s=0, state_file=str(state_file)) as server:
        settings.VAST_API_URL, settings.VAST_API_KEY = server.base_url, MARKET_KEY
        settings.PROVIDER_MAX_RETRIES = 2
        yield server


def _history(row: Instance) -> tuple:
    row.refresh_from_db()
    return (row.state, row.usd_per_hour, row.started_at, row.ended_at, row.provider_instance_id, row.failure_reason,
            list(row.events.order_by("pk").values_list("kind", "message")),
            list(row.cost_segments.order_by("pk").values_list("usd_per_hour", "started_at", "ended_at")))


def _listed_ids() -> list[str]:
    with get_provider() as provider:
        return sorted(record.instance_id for record in provider.list_instances())


def test_a_serving_replica_outlives_a_restart_of_the_marketplace(tmp_path, settings):
    model = InferenceModel.objects.create(name="Qwen/Qwen3-30B-A3B", image="vllm/vllm-openai:v0.9.2", port=8000,
                                          desired_replicas=1, max_replacements_per_day=3)
    with marketplace(tmp_path / "market.json", settings) as market:
        refresh_offers()
        replicas.maintain()
        first = Instance.objects.get(serving_model=model)
        market.advance(600)
        actions.sync()
        actions.fail(first, "its probes failed")  # replaced: the first box ends, a second one serves
        actions.sync()
        replicas.maintain()
        serving = Instance.objects.get(serving_model=model, state__in=Instance.LIVE_STATES)
        market.advance(600)
        actions.sync()
        serving.refresh_from_db()
        assert serving.state == State.RUNNING and _listed_ids() == [serving.provider_instance_id]
        ended = _history(first)
        assert ended[0] == State.DESTROYED
        alerts = Alert.objects.count()
    with marketplace(tmp_path / "market.json", settings) as market:
        report = actions.sync()
        assert _listed_ids() == [serving.provider_instance_id]  # the same box, under the same id
        assert report.gone == [] and report.destroy_retried == [] and report.adopted == []
        serving.refresh_from_db()
        assert serving.state == State.RUNNING and serving.provider_status == "running"
        (_, state), = replicas.model_states(serving.running_at)
        assert state.live_replicas == 1
        assert replicas.maintain().models[0].rented == []  # no replacement rented, no budget spent
        assert _history(first) == ended
        assert Alert.objects.count() == alerts
