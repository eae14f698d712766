"""Saving and deleting offer profiles on the Offers page: a refused name or number is said beside its field with what
was typed kept, on every database; a profile is deleted after a confirmation that says what ranks with it."""

import re
from decimal import Decimal

import pytest
from django.urls import reverse

from fleet.models import InferenceModel, OfferProfile
from fleet.offers.forms import RankingForm
from fleet.ranking import OfferFilters, Workload
from runs.launch import launch
from runs.models import Run
from tests.runs.conftest import tiny_recipe

pytestmark = pytest.mark.django_db
LONG_NAME = "a" * 300


def _params(**changes) -> dict:
    data = RankingForm.data_for(Workload(), OfferFilters())
    data.update(changes)
    return {k: v for k, v in data.items() if v is not None and v is not False and v != ""}


def _input_value(body: str, name: str) -> str:
    match = re.search(rf'<input type="text" name="{name}" value="([^"]*)"', body)
    assert match, f"no text input {name} kept"
    return match.group(1)


def _beside(body: str, name: str) -> str:
    match = re.search(rf'<span class="field-error" id="error-{name}"( hx-swap-oob="true")?>(.*?)</span></span>', body,
                      re.S)
    return match.group(2) if match else ""


def test_it_refuses_a_name_longer_than_the_field_and_keeps_it(client, staff):
    client.force_login(staff)
    response = client.post(reverse("save_profile"), {**_params(), "profile_name": LONG_NAME})
    body = response.content.decode()
    assert response.status_code == 400 and not OfferProfile.objects.exists()
    assert _input_value(body, "profile_name") == LONG_NAME
    assert "At most 60 characters (this has 300)." in _beside(body, "profile_name")


def test_a_name_longer_than_the_column_is_refused_whoever_saves_it(operator):
    from fleet.offers import profiles

    with pytest.raises(profiles.Refused, match="1 to 60 characters, not 61"):
        profiles.save("a" * 61, Workload(), OfferFilters(), by=operator, may_add=True, may_replace=True)
    assert not OfferProfile.objects.exists()


@pytest.mark.parametrize("field, typed, words", [
    ("min_reliability", "NaN", "Enter a number"),
    ("checkpoint_interval_min", "inf", "Enter a number"),
    ("max_usd_per_hour", "abc", "Enter a number"),
    ("max_usd_per_hour", "1e308", "At most 1,000."),
    ("min_disk_gb", "1e308", "At most 1,000,000."),
])
def test_it_keeps_a_refused_number_as_typed_with_its_message_beside_it(client, staff, field, typed, words):
    client.force_login(staff)
    params = {**_params(seq_len="4096", lora_rank="32"), field: typed, "profile_name": "mine"}
    response = client.post(reverse("save_profile"), params)
    body = response.content.decode()
    assert response.status_code == 400 and not OfferProfile.objects.exists()
    assert _input_value(body, field) == typed
    assert words in _beside(body, field)
    assert _input_value(body, "seq_len") == "4096" and _input_value(body, "lora_rank") == "32"
    assert _input_value(body, "profile_name") == "mine"  # not the defaults again


def test_an_htmx_save_says_each_refusal_beside_its_field_and_leaves_the_page(client, staff):
    client.force_login(staff)
    response = client.post(reverse("save_profile"), {**_params(max_usd_per_hour="abc"), "profile_name": LONG_NAME},
                           HTTP_HX_REQUEST="true")
    body = response.content.decode()
    assert response.status_code == 200 and "HX-Redirect" not in response.headers  # htmx swaps a 2xx only
    assert "Enter a number" in _beside(body, "max_usd_per_hour")
    assert "At most 60 characters" in _beside(body, "profile_name")
    assert 'id="profile-not-saved" hx-swap-oob="true"' in body and not OfferProfile.objects.exists()


def test_the_offers_page_sends_numbers_as_typed(client, member):
    # A number input sends nothing for "abc" or "NaN", and a blank price cap is no cap.
    client.force_login(member)
    body = client.get(reverse("offers")).content.decode()
    assert '<input type="text" name="max_usd_per_hour"' in body and 'type="number"' not in body
    assert 'inputmode="decimal"' in body


@pytest.fixture
def ranked_with(tmp_path):
    profile = OfferProfile.objects.create(name="team-h200", recipe=Workload().to_dict(),
                                          filters=OfferFilters().to_dict())
    launch(name="uses-it", recipe=tiny_recipe(), bucket=str(tmp_path / "bucket"), budget_usd=Decimal(5),
           max_restarts=1, profile=profile)
    InferenceModel.objects.create(name="served", image="vllm/vllm-openai", profile=profile)
    return profile


def test_a_profile_is_deleted_after_a_confirmation_that_says_what_ranks_with_it(client, staff, ranked_with):
    client.force_login(staff)
    offers = client.get(reverse("offers"), {"profile": "team-h200"}).content.decode()
    url = reverse("delete_profile", args=[ranked_with.pk])
    assert f'href="{url}"' in offers
    confirm = client.get(url).content.decode()
    assert "1 inference model and 1 run rank offers with it" in confirm and "csrfmiddlewaretoken" in confirm
    assert OfferProfile.objects.exists()  # asking deletes nothing
    page = client.post(url, follow=True).content.decode()
    assert not OfferProfile.objects.exists()
    assert "Profile &#x27;team-h200&#x27; deleted. 1 inference model and 1 run that ranked with it now rank with " \
           "the defaults." in page
    assert Run.objects.get().profile is None and InferenceModel.objects.get().profile is None


def test_only_those_with_the_delete_permission_delete_a_profile(client, member, staff, ranked_with):
    url = reverse("delete_profile", args=[ranked_with.pk])
    client.force_login(member)
    assert client.post(url).status_code == 403
    staff.user_permissions.remove(*staff.user_permissions.filter(codename="delete_offerprofile"))
    client.force_login(staff)
    assert client.post(url).status_code == 403
    assert f'href="{url}"' not in client.get(reverse("offers"), {"profile": "team-h200"}).content.decode()
    assert OfferProfile.objects.exists()


def test_deleting_needs_a_post_with_the_csrf_token(staff, ranked_with):
    from django.test import Client

    client = Client(enforce_csrf_checks=True)
    client.force_login(staff)
    assert client.post(reverse("delete_profile", args=[ranked_with.pk])).status_code == 403
    assert OfferProfile.objects.exists()
