"""The product's own offer filters in the form vast.ai documents its search: location by two-letter country code (in
and notin), datacenter hosts, GPU memory bandwidth. The Offers page keeps exactly the offers the simulated vast.ai's
search keeps for the same query, and says why it drops each other one."""

import re
from decimal import Decimal

import httpx
import pytest
from django.urls import reverse

from fleet.models import Offer, OfferProfile
from fleet.offers.forms import RankingForm
from fleet.offers.ranked import rank_stored_offers
from fleet.offers.refresh import refresh_offers
from fleet.providers.vast import parse_offer
from fleet.ranking import OfferFilters
from tests.marketplace import MARKET_KEY

from .test_offers_page import _excluded, _params, _ranked

pytestmark = pytest.mark.django_db

# vast.ai's documented answer for one offer (docs.vast.ai, "search offers"), the fields these filters read.
DOCUMENTED_OFFER = {
    "id": 12345678, "ask_contract_id": 12345678, "bundle_id": 987654321, "bw_nvlink": 0, "compute_cap": 900,
    "cpu_arch": "amd64", "cpu_cores": 64, "cpu_cores_effective": 32, "cpu_ghz": 2.99, "cpu_ram": 65536,
    "cuda_max_good": 11.2, "direct_port_count": 42, "disk_bw": 1234.5, "disk_space": 2048.5, "dlperf": 222.22,
    "dlperf_per_dphtotal": 333.33, "dph_base": 0.123456, "dph_total": 0.234567, "driver_version": "999.99.99",
    "driver_vers": 999999999, "duration": 1234567.89, "external": None, "flops_per_dphtotal": 444.44,
    "geolocation": "Atlantis, AT", "geolocode": 42424242, "gpu_arch": "nvidia", "gpu_display_active": False,
    "gpu_frac": 0.75, "gpu_mem_bw": 888.8, "gpu_name": "Imaginary RTX 9999", "gpu_ram": 24576,
    "gpu_total_ram": 49152, "gpu_max_power": 450, "gpu_max_temp": 42, "has_avx": 1, "host_id": 55555,
    "hosting_type": 0, "inet_down": 9876.5, "inet_down_cost": 0.00123, "inet_up": 8765.4, "inet_up_cost": 0.00456,
    "is_bid": False, "machine_id": 88888, "min_bid": 0.111111, "mobo_name": "FANTASY-MOBO-2025", "num_gpus": 4,
    "os_version": "42.42", "pci_gen": 6, "pcie_bw": 99.9, "reliability": 0.98, "rentable": True, "rented": False,
    "storage_cost": 0.15, "total_flops": 123.4, "verification": "verified",
}

LOOSE = {"gpu_tiers": [], "max_usd_per_hour": "", "min_driver_version": "", "min_cuda": 0, "min_disk_gb": 0,
         "min_inet_down_mbps": 0, "min_inet_up_mbps": 0, "min_reliability": 0, "max_gpus": ""}


def test_the_client_reads_the_documented_host_fields():
    offer = parse_offer(DOCUMENTED_OFFER)
    assert offer.datacenter is False and offer.gpu_mem_bw_gb_s == 888.8 and offer.geolocation == "Atlantis, AT"
    assert offer.cpu_ram_gb == 64.0  # cpu_ram in MB, as gpu_ram
    assert parse_offer({k: v for k, v in DOCUMENTED_OFFER.items() if k != "cpu_ram"}).cpu_ram_gb is None
    assert parse_offer({**DOCUMENTED_OFFER, "hosting_type": 1}).datacenter is True
    assert parse_offer({k: v for k, v in DOCUMENTED_OFFER.items() if k not in ("hosting_type", "gpu_mem_bw")}
                       ).datacenter is None


def _vast_search(market, query: dict) -> set[str]:
    response = httpx.post(f"{market.base_url}/bundles/", json={**query, "limit": 1000},
                          headers={"Authorization": f"Bearer {MARKET_KEY}"})
    assert response.status_code == 200, response.text
    return {str(o["id"]) for o in response.json()["offers"]}


@pytest.mark.parametrize(("page", "query", "reason"), [
    ({"locations": "TW, SE"}, {"geolocation": {"in": ["TW", "SE"]}}, r"location [A-Z]{2} not in SE, TW"),
    ({"excluded_locations": "NA"}, {"geolocation": {"notin": ["US", "CA", "MX"]}},
     r"location (US|CA) is excluded \(NA\)"),
    ({"locations": "EU", "excluded_locations": "de, se"},
     {"geolocation": {"in": sorted(OfferFilters(locations=["EU"]).allowed_countries - {"DE", "SE"})}},
     r"location [A-Z]{2} (not in EU|is excluded \(DE, SE\))"),
    ({"datacenter_only": "on"}, {"datacenter": {"eq": True}}, r"not a datacenter host"),
    ({"min_gpu_mem_bw_gb_s": "3000"}, {"gpu_mem_bw": {"gte": 3000}}, r"GPU memory \d+(\.\d+)? GB/s < 3000"),
])
def test_the_offers_page_keeps_what_vast_ais_search_keeps(client, member, market, page, query, reason):
    refresh_offers()
    kept_by_vast = _vast_search(market, query)
    listed = set(Offer.objects.filter(available=True, is_bid=False).values_list("offer_id", flat=True))
    assert kept_by_vast and kept_by_vast < listed

    form = RankingForm(data=_params(**LOOSE, **page))
    assert form.is_valid(), form.errors
    ranking = rank_stored_offers(form.recipe, form.filters)
    ranked = {entry.offer.offer_id for entry in ranking.entries if not entry.offer.is_bid}
    why = {e.offer.offer_id: "; ".join(e.reasons) for e in ranking.excluded if not e.offer.is_bid}
    assert ranked and ranked <= kept_by_vast
    for offer_id in kept_by_vast - ranked:  # dropped for another reason (VRAM for the model, say), never this one
        assert not re.search(reason, why[offer_id]), why[offer_id]
    dropped = {offer_id for offer_id, reasons in why.items() if re.search(reason, reasons)}
    assert dropped == listed - kept_by_vast  # what vast.ai's search leaves out, the ranking leaves out, saying so

    client.force_login(member)
    body = client.get(reverse("offers"), _params(**LOOSE, **page)).content.decode()
    shown = {offer_id for offer_id, bid in _ranked(body) if not bid}
    assert shown and shown <= ranked
    assert all(re.search(reason, reasons) for offer_id, reasons in _excluded(body).items() if offer_id in dropped)


def test_a_profile_keeps_the_documented_filters(client, member, market):
    filters = OfferFilters(locations=["eu"], excluded_locations="DE,se", datacenter_only=True,
                           min_gpu_mem_bw_gb_s=3000)
    OfferProfile.objects.create(name="h200-eu-dc", recipe={}, filters=filters.to_dict(), created_by=member)
    saved = OfferFilters.from_dict(OfferProfile.objects.get(name="h200-eu-dc").filters)
    assert saved == filters
    assert saved.excluded_countries == {"DE", "SE"} and saved.datacenter_only and saved.min_gpu_mem_bw_gb_s == 3000
    with pytest.raises(ValueError, match="excluded_locations: 'Sweden' is neither a two-letter country code"):
        OfferFilters(excluded_locations=["Sweden"])
    assert Decimal(filters.to_dict()["max_usd_per_hour"]) == Decimal("1.30")
