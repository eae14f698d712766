"""Saving offer profiles: a new name needs the add permission; writing over a profile that runs rank with needs the
change permission, and the page says so."""

import pytest
from django.contrib.auth.models import Permission
from django.urls import reverse

from fleet.models import OfferProfile
from fleet.offers.forms import RankingForm
from fleet.ranking import OfferFilters, Workload

pytestmark = pytest.mark.django_db


def _form(**changes) -> dict:
    data = RankingForm.data_for(Workload(), OfferFilters())
    data.update(changes)
    return {key: value for key, value in data.items() if value is not None}


@pytest.fixture
def shared_profile():
    """A profile someone else saved, with a $1.30/h cap that the runs ranked by it rent under."""
    return OfferProfile.objects.create(name="team-h200", recipe=Workload().to_dict(),
                                       filters=OfferFilters.from_dict({"max_usd_per_hour": "1.30"}).to_dict())


def _staff_with(django_user_model, *codenames):
    user = django_user_model.objects.create_user("adder", password="adder-pass-123", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="fleet", codename__in=codenames))
    return user


def test_it_refuses_to_overwrite_a_profile_with_only_the_add_permission(client, django_user_model, shared_profile):
    client.force_login(_staff_with(django_user_model, "add_offerprofile", "view_offerprofile"))
    response = client.post(reverse("save_profile"), {**_form(max_usd_per_hour="50"), "profile_name": "Team H200"},
                           follow=True)
    shared_profile.refresh_from_db()
    assert shared_profile.filters["max_usd_per_hour"] == "1.30"
    assert "replacing it needs the change offer profile permission" in response.content.decode()


def test_it_overwrites_a_profile_with_the_change_permission(client, django_user_model, shared_profile):
    client.force_login(_staff_with(django_user_model, "change_offerprofile"))
    response = client.post(reverse("save_profile"), {**_form(max_usd_per_hour="3"), "profile_name": "team-h200"},
                           follow=True)
    shared_profile.refresh_from_db()
    assert shared_profile.filters["max_usd_per_hour"] == "3"
    assert "Profile &#x27;team-h200&#x27; replaced." in response.content.decode()


def test_it_makes_a_new_profile_only_with_the_add_permission(client, django_user_model):
    client.force_login(_staff_with(django_user_model, "change_offerprofile"))
    response = client.post(reverse("save_profile"), {**_form(), "profile_name": "mine"}, follow=True)
    assert not OfferProfile.objects.filter(name="mine").exists()
    assert "making one needs the add offer profile permission" in response.content.decode()


def test_it_makes_a_new_profile_with_the_add_permission(client, django_user_model, shared_profile):
    client.force_login(_staff_with(django_user_model, "add_offerprofile"))
    response = client.post(reverse("save_profile"), {**_form(), "profile_name": "mine"})
    assert response.status_code == 302 and response["Location"].endswith("?profile=mine")
    assert OfferProfile.objects.get(name="mine").created_by.username == "adder"
    assert OfferProfile.objects.get(name="team-h200").filters["max_usd_per_hour"] == "1.30"
