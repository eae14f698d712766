"""The simulated marketplace's boxes of several GPUs: listed with how their GPUs talk (NVLink or PCIe), stored and
ranked so by the product, rented through its vast.ai client for a recipe on two GPUs, and run on the CPU."""

from decimal import Decimal

import httpx
import pytest

from fleet import actions
from fleet.models import Offer
from fleet.offers.refresh import refresh_offers
from fleet.ranking import OfferFilters, Workload
from fleet.simulator.agents import AgentProcesses
from tests.marketplace import MARKET_KEY

pytestmark = pytest.mark.django_db


def test_it_lists_boxes_of_two_four_and_eight_gpus_over_nvlink_and_over_pcie(market):
    refresh_offers()
    for n in (2, 4, 8):
        boxes = Offer.objects.filter(num_gpus=n)
        assert boxes.filter(nvlink_gb_s__gt=0).exists(), n
        assert boxes.filter(nvlink_gb_s=0, pcie_gb_s__gt=0).exists(), n
    listed = {o["id"]: o for o in market.offers()}
    for offer in Offer.objects.filter(num_gpus__gt=1, is_bid=False):
        raw = listed[int(offer.offer_id)]
        assert (offer.nvlink_gb_s, offer.pcie_gb_s) == (raw["bw_nvlink"], raw["pcie_bw"])
    pcie_cards = Offer.objects.filter(num_gpus__gt=1, gpu_name__startswith="RTX PRO 6000")
    assert pcie_cards.exists() and not pcie_cards.exclude(nvlink_gb_s=0).exists()


def test_it_rents_a_two_gpu_box_over_nvlink_for_a_recipe_on_two(market):
    refresh_offers()
    rented = actions.rent_best(Workload(gpus=2), OfferFilters(max_usd_per_hour=Decimal("6")),
                               idempotency_key="two-gpus", purpose="training")
    assert rented is not None
    box = rented.instance
    assert box.state == "provisioning" and box.num_gpus == 2
    offer = Offer.objects.get(provider="vast", offer_id=box.offer_id, is_bid=False)
    assert offer.nvlink_gb_s > 0  # the catalogue's PCIe pairs list for less, and still rank below
    assert Offer.objects.filter(num_gpus=2, nvlink_gb_s=0, total_usd_per_hour__lt=offer.total_usd_per_hour).exists()
    listed = httpx.get(f"{market.base_url}/instances/{box.provider_instance_id}/",
                       headers={"Authorization": f"Bearer {MARKET_KEY}"}).json()["instances"]
    assert (listed["num_gpus"], listed["gpu_name"]) == (2, offer.gpu_name)
    assert listed["gpu_totalram"] == 2 * listed["gpu_ram"]


def test_a_simulated_box_sees_none_of_this_machines_gpus(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")  # a host with GPUs
    agents = AgentProcesses(tmp_path)
    show = "import os; print('visible=' + repr(os.environ['CUDA_VISIBLE_DEVICES']))"
    try:
        agents.on_running({"id": 7, "onstart": f'python -c "{show}"', "env": {}})
        agents.processes[7].wait(timeout=30)
        assert "visible=''" in agents.logs(7)
        agents.on_running({"id": 8, "onstart": f'python -c "{show}"', "env": {"CUDA_VISIBLE_DEVICES": "0"}})
        agents.processes[8].wait(timeout=30)
        assert "visible='0'" in agents.logs(8)  # what the rent asked for wins
    finally:
        agents.stop_all()


def test_the_offers_page_shows_each_boxs_gpu_count_and_link_for_a_recipe_on_two(client, member, market):
    import re

    from django.urls import reverse

    from fleet.offers.forms import RankingForm

    refresh_offers()
    client.force_login(member)
    data = RankingForm.data_for(Workload(gpus=2), OfferFilters(max_usd_per_hour=Decimal("6"), max_gpus=None))
    body = client.get(reverse("offers"), {k: v for k, v in data.items() if v not in (None, False, "")}).content
    table = body.decode().split('id="ranked"', 1)[1].split("</table>", 1)[0]
    rows = re.findall(r'<td class="gpu">(\d+)× ([^(]+) \(.*?<td class="gpu-link" data-label="link">(.*?)</td>', table,
                      re.S)
    assert rows and all(int(n) >= 2 for n, _, _ in rows)
    links = {name.strip(): link for _, name, link in rows}
    assert ">NVLink</span>" in links["H200 NVL"] and 'title="between its GPUs: NVLink 900 GB/s"' in links["H200 NVL"]
    assert ">PCIe</span>" in links["RTX PRO 6000 WS"]
    one = client.get(reverse("offers")).content.decode().split('id="ranked"', 1)[1].split("</table>", 1)[0]
    cells = re.findall(r'<td class="gpu-link" data-label="link">(.*?)</td>', one)
    assert cells and set(cells) == {"–"}  # one GPU: nothing between GPUs to show
