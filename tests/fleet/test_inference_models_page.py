"""Inference models are added and changed from the Inference fleet page itself (the admin only shows them), by
staff with the permission, through CSRF-checked forms that say by each field what is wrong."""

import re

import pytest
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse

from fleet import enqueue
from fleet.models import InferenceModel, OfferProfile

pytestmark = pytest.mark.django_db
NEW = {"name": "Qwen/Qwen3-30B-A3B", "image": "vllm/vllm-openai:v0.9.2", "port": "8000", "desired_replicas": "2",
       "max_replacements_per_day": "3", "profile": ""}


@pytest.fixture
def maintained(monkeypatch):
    calls = []
    monkeypatch.setattr(enqueue, "maintain_inference_fleet", lambda: calls.append("maintain"))
    return calls


def csrf_client(user) -> Client:
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    return client


def token(client, url) -> str:
    page = client.get(url).content.decode()
    return re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.split("<main>")[1]).group(1)


def errors_by_field(page: str) -> dict[str, list[str]]:
    found = {}
    for field, message in re.findall(r'<span class="error" data-field="([^"]+)">(.*?)</span>', page):
        found.setdefault(field, []).append(message)
    return found


def with_perms(django_user_model, name, *codenames):
    user = django_user_model.objects.create_user(name, password="x-pass-123", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="fleet", codename__in=codenames))
    return user


def test_it_offers_to_add_the_first_model_on_the_page_instead_of_sending_to_the_admin(client, staff):
    client.force_login(staff)
    page = client.get(reverse("inference")).content.decode()
    assert "Admin" not in page.split("<main>")[1]
    assert f'href="{reverse("inference_model_add")}"' in page


def test_it_adds_a_model_with_csrf_and_asks_the_fleet_to_follow(staff, maintained,
                                                                   django_capture_on_commit_callbacks):
    client = csrf_client(staff)
    url = reverse("inference_model_add")
    assert client.post(url, NEW).status_code == 403  # no CSRF token
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(url, {**NEW, "csrfmiddlewaretoken": token(client, url)})
    assert response.status_code == 302 and response["Location"] == reverse("inference")
    model = InferenceModel.objects.get()
    assert (model.name, model.image, model.port, model.desired_replicas, model.max_replacements_per_day,
            model.profile) == ("Qwen/Qwen3-30B-A3B", "vllm/vllm-openai:v0.9.2", 8000, 2, 3, None)
    assert maintained == ["maintain"]
    page = client.get(reverse("inference")).content.decode()
    assert f'data-model="{model.pk}"' in page and "Qwen/Qwen3-30B-A3B: added, 2 desired replica(s)." in page


def test_it_changes_a_models_name_image_replicas_and_profile(staff, maintained, django_capture_on_commit_callbacks):
    model = InferenceModel.objects.create(name="old/model", image="vllm/vllm-openai:v0.9.1", desired_replicas=1)
    profile = OfferProfile.objects.create(name="cheap-h100", recipe={}, filters={})
    client = csrf_client(staff)
    url = reverse("inference_model_change", args=[model.pk])
    assert "old/model" in client.get(url).content.decode()
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(url, {**NEW, "desired_replicas": "4", "profile": "cheap-h100",
                                     "csrfmiddlewaretoken": token(client, url)})
    assert response.status_code == 302
    model.refresh_from_db()
    assert (model.name, model.image, model.desired_replicas, model.profile) == (
        "Qwen/Qwen3-30B-A3B", "vllm/vllm-openai:v0.9.2", 4, profile)
    assert maintained == ["maintain"]


@pytest.mark.parametrize("bad, field, says", [
    ({"name": "Qwen 30B"}, "name", "A model id has no spaces"),
    ({"name": ""}, "name", "This field is required."),
    ({"image": "vllm; rm -rf /"}, "image", "An image reference is letters, digits"),
    ({"port": "0"}, "port", "greater than or equal to 1"),
    ({"port": "70000"}, "port", "less than or equal to 65535"),
    ({"desired_replicas": "101"}, "desired_replicas", "less than or equal to 100"),
    ({"desired_replicas": "-1"}, "desired_replicas", "greater than or equal to 0"),
    ({"max_replacements_per_day": "1e9"}, "max_replacements_per_day", "Enter a whole number."),
    ({"profile": "no-such-profile"}, "profile", "Select a valid choice."),
])
def test_it_says_by_each_field_what_is_wrong_and_saves_nothing(client, staff, maintained, bad, field, says):
    client.force_login(staff)
    response = client.post(reverse("inference_model_add"), {**NEW, **bad})
    assert response.status_code == 400
    errors = errors_by_field(response.content.decode())
    assert list(errors) == [field] and says in errors[field][0]
    assert not InferenceModel.objects.exists() and maintained == []


def test_it_refuses_a_second_model_of_one_name(client, staff, maintained):
    InferenceModel.objects.create(name=NEW["name"], image="vllm/vllm-openai:v0.9.1")
    client.force_login(staff)
    response = client.post(reverse("inference_model_add"), NEW)
    assert response.status_code == 400
    assert errors_by_field(response.content.decode()) == {
        "name": ["An inference model named Qwen/Qwen3-30B-A3B exists already."]}
    assert InferenceModel.objects.count() == 1


def test_it_lets_only_staff_with_the_permission_add_or_change(client, member, django_user_model, maintained):
    model = InferenceModel.objects.create(name="old/model", image="vllm/vllm-openai:v0.9.1")
    add, change = reverse("inference_model_add"), reverse("inference_model_change", args=[model.pk])
    adder = with_perms(django_user_model, "adder", "add_inferencemodel")
    for user, may_add, may_change in ((member, False, False), (adder, True, False),
                                      (with_perms(django_user_model, "plain"), False, False)):
        client.force_login(user)
        assert (client.get(add).status_code == 200) is may_add
        assert (client.get(change).status_code == 200) is may_change
        assert client.post(change, {**NEW, "name": "renamed/model"}).status_code == 403
        page = client.get(reverse("inference")).content.decode()
        assert (f'href="{add}"' in page) is may_add and (f'href="{change}"' in page) is may_change
    model.refresh_from_db()
    assert model.name == "old/model" and maintained == []
