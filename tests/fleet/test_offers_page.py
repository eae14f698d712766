"""The Offers page ranks the stored offers with the user's recipe and filters, and explains every exclusion."""

import html
import json
import re
from io import StringIO

import pytest
from django.contrib.auth.models import Permission
from django.core.management import CommandError, call_command
from django.urls import reverse

from fleet.offers.calibration import load_calibration, record_finished_run
from fleet.offers.forms import RankingForm
from fleet.models import Offer, OfferProfile
from fleet.offers.ranked import refresh_profile_rankings
from fleet.offers.refresh import refresh_offers
from fleet.ranking import OfferFilters, Workload

pytestmark = pytest.mark.django_db


def _params(**changes) -> dict:
    data = RankingForm.data_for(Workload(), OfferFilters())
    data.update(changes)
    return {k: v for k, v in data.items() if v is not None and v is not False and v != ""}


def _ranked(body: str) -> list[tuple[str, bool]]:
    table = body.split('id="ranked"', 1)[1].split("</table>", 1)[0]
    return [(offer_id, bid == "1") for offer_id, bid in re.findall(r'<tr data-offer="(\d+)" data-bid="(\d)"', table)]


def _ranked_offers(body: str) -> list[Offer]:
    return [Offer.objects.get(offer_id=offer_id, is_bid=bid) for offer_id, bid in _ranked(body)]


def _excluded(body: str) -> dict[str, str]:
    table = body.split('id="excluded"', 1)[1]
    rows = re.findall(r'<tr data-offer="(\d+)" data-bid="0">.*?<td class="reasons">([^<]*)</td>\s*</tr>', table, re.S)
    return {offer_id: html.unescape(reasons) for offer_id, reasons in rows}


@pytest.fixture
def listed(market):
    refresh_offers()
    return Offer.objects.filter(available=True)


def test_it_ranks_by_default_filters(client, member, listed):
    client.force_login(member)
    body = client.get(reverse("offers")).content.decode()
    ranked = _ranked_offers(body)
    assert ranked, "the default filters should leave some offers"
    for offer in ranked:
        assert offer.total_usd_per_hour <= 1.30 and not offer.is_bid and offer.reliability >= 0.95
    excluded = _excluded(body)
    assert any(re.search(r"\$\d+\.\d+/h > cap \$1\.30", why) for why in excluded.values())


def test_it_changes_the_list_when_a_filter_changes(client, member, listed):
    client.force_login(member)
    default = _ranked(client.get(reverse("offers"), _params()).content.decode())
    wider = _ranked(client.get(reverse("offers"), _params(max_usd_per_hour="6")).content.decode())
    assert set(default) < set(wider)
    with_bids = client.get(reverse("offers"), _params(max_usd_per_hour="6", allow_bids="on")).content.decode()
    assert "bid (interruptible)" in with_bids.split('id="ranked"', 1)[1].split("</table>")[0]


def test_it_returns_only_the_results_to_htmx(client, member, listed):
    client.force_login(member)
    partial = client.get(reverse("offers"), _params(min_reliability="0.99", max_usd_per_hour="6"),
                         HTTP_HX_REQUEST="true")
    body = partial.content.decode()
    assert 'id="ranked"' in body and "<html" not in body
    ranked = _ranked_offers(body)
    assert ranked
    for offer in ranked:
        assert offer.reliability >= 0.99


def test_it_finds_an_excluded_offer_with_its_reasons(client, member, listed):
    old = listed.filter(driver_version__startswith="535", is_bid=False).first()
    client.force_login(member)
    body = client.get(reverse("offers"), _params(find=old.offer_id)).content.decode()
    reasons = _excluded(body)[old.offer_id]
    assert f"driver {old.driver_version} < needed 570" in reasons


def test_it_explains_bad_filter_values(client, member, listed):
    client.force_login(member)
    body = client.get(reverse("offers"), _params(phases="sft:many", min_reliability="2")).content.decode()
    assert "not phase:steps" in body
    assert "Min reliability</a>: At most 1." in body
    assert 'id="ranked"' not in body


def test_it_sorts_by_projected_total_cost(client, member, listed):
    client.force_login(member)
    params = _params(max_usd_per_hour="6", sort="total")
    body = client.get(reverse("offers"), params).content.decode()
    run_cost = (r'<td class="num" data-label="run cost"><span class="price"[^>]*>\$([\d.]+)</span></td>'
                r'\s*<td class="why">')
    costs = [float(c) for c in re.findall(run_cost, body)]
    assert len(costs) > 2 and costs == sorted(costs)


def test_it_saves_a_profile_and_ranks_it_again(client, staff, listed):
    client.force_login(staff)
    response = client.post(reverse("save_profile"), {**_params(min_reliability="0.99", max_usd_per_hour="3"),
                                                      "profile_name": "Reliable H200"})
    assert response.status_code == 302 and response["Location"].endswith("?profile=reliable-h200")
    profile = OfferProfile.objects.get(name="reliable-h200")
    assert profile.filters["min_reliability"] == 0.99 and profile.filters["max_usd_per_hour"] == "3"
    body = client.get(response["Location"]).content.decode()
    assert 'value="0.99"' in body
    ranked = _ranked_offers(body)
    assert ranked
    for offer in ranked:
        assert offer.reliability >= 0.99


def test_it_forbids_saving_a_profile_without_the_permission(client, member, listed):
    client.force_login(member)
    response = client.post(reverse("save_profile"), {**_params(), "profile_name": "mine"})
    assert response.status_code == 403
    assert not OfferProfile.objects.exists()


def test_it_forbids_saving_a_profile_to_a_non_staff_user_who_holds_the_permission(client, member, listed):
    # One rule for every side effect: staff who hold the permission, whatever page it is on.
    member.user_permissions.add(Permission.objects.get(codename="add_offerprofile"))
    client.force_login(member)
    assert client.post(reverse("save_profile"), {**_params(), "profile_name": "mine"}).status_code == 403
    assert not OfferProfile.objects.exists()


def test_it_ranks_a_profile_from_the_command_line(listed):
    OfferProfile.objects.create(name="cheap", recipe=Workload().to_dict(),
                                filters=OfferFilters(max_usd_per_hour="5").to_dict())
    out = StringIO()
    call_command("rank_offers", "--profile", "cheap", "--json", "--limit", "3", stdout=out)
    data = json.loads(out.getvalue())
    assert len(data["ranked"]) == 3 and data["filters"]["max_usd_per_hour"] == "5"
    assert [r["rank"] for r in data["ranked"]] == [1, 2, 3]
    assert all(x["reasons"] for x in data["excluded"])
    with pytest.raises(CommandError, match="No offer profile 'nope'"):
        call_command("rank_offers", "--profile", "nope")


def test_it_keeps_each_profiles_best_offer_for_the_dashboard(client, member, listed):
    OfferProfile.objects.create(name="any-price", recipe=Workload().to_dict(),
                                filters=OfferFilters(max_usd_per_hour=None).to_dict())
    assert refresh_profile_rankings() == 1
    best = OfferProfile.objects.get().last_ranking["ranked"][0]
    client.force_login(member)
    body = client.get(reverse("dashboard")).content.decode()
    assert f"{best['offer_id']}: {best['num_gpus']}× {best['gpu_name']}" in body


def test_it_stores_calibration_from_finished_runs():
    before = load_calibration().get("H200", "grouped_mm").model_tflops
    entry = record_finished_run(gpu_name="NVIDIA H200", kernel_path="grouped_mm", recipe=Workload(),
                                step_seconds=14.0)
    assert entry.measured_runs == 1 and entry.model_tflops > before  # faster than the seed: the mean moves up
    assert load_calibration().get("H200", "grouped_mm") == entry
