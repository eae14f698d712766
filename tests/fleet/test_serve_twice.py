"""Two posts that make the same inference model at once (two clicks of "Serve this adapter", or of "Add"): both pass
the form's check of the name, one is made, and the other is told by its name field that the name is taken, never
a 500."""

import threading

import pytest
from django.db import connection, transaction
from django.test import Client
from django.urls import reverse

from fleet import enqueue
from fleet.inference.forms import InferenceModelForm, ServeAdapterForm
from fleet.models import InferenceModel
from runs import serving
from tests.fleet.test_serve_adapter import _finished_run, _serve_data

TAKEN = "exists already"


@pytest.fixture(autouse=True)
def _no_broker(monkeypatch):
    monkeypatch.setattr(enqueue, "maintain_inference_fleet", lambda: None)


def _at_once(monkeypatch, form_class, check: str, user, url: str, data: dict) -> list:
    """Posts `data` to `url` from two clients whose forms both pass `check` before either saves: their answers."""
    barrier, original = threading.Barrier(2, timeout=20), getattr(form_class, check)

    def checked_then_wait(form, *args, **kwargs):
        result = original(form, *args, **kwargs)
        barrier.wait()
        return result

    monkeypatch.setattr(form_class, check, checked_then_wait)
    answers: list = []

    def post():
        try:
            client = Client()
            client.force_login(user)
            answers.append(client.post(url, data))
        finally:
            connection.close()

    threads = [threading.Thread(target=post) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return sorted(answers, key=lambda answer: answer.status_code)


@pytest.mark.django_db(transaction=True)
def test_two_serve_posts_at_once_make_one_model_and_tell_the_other_its_name_is_taken(monkeypatch, staff,
                                                                                      tmp_path):
    run = _finished_run(tmp_path)
    client = Client()
    client.force_login(staff)
    data = _serve_data(client, run)
    made, refused = _at_once(monkeypatch, ServeAdapterForm, "clean_name", staff,
                             reverse("run_serve", args=[run.pk]), data)
    assert (made.status_code, refused.status_code) == (302, 400)
    assert f"An inference model named {data['name']} {TAKEN}." in refused.content.decode()
    assert refused.context["form"].errors == {"name": [f"An inference model named {data['name']} {TAKEN}."]}
    assert list(InferenceModel.objects.values_list("name", flat=True)) == [data["name"]]


@pytest.mark.django_db(transaction=True)
def test_two_add_posts_at_once_make_one_model_and_tell_the_other_its_name_is_taken(monkeypatch, staff):
    data = {"name": "Qwen/Qwen3-30B-A3B", "image": "vllm/vllm-openai:v0.9.2", "port": "8000",
            "desired_replicas": "2", "max_replacements_per_day": "3", "profile": ""}
    made, refused = _at_once(monkeypatch, InferenceModelForm, "validate_unique", staff,
                             reverse("inference_model_add"), data)
    assert (made.status_code, refused.status_code) == (302, 400)
    assert f"An inference model named {data['name']} {TAKEN}." in refused.content.decode()
    assert InferenceModel.objects.count() == 1


@pytest.mark.django_db
def test_serving_a_taken_name_says_so_and_leaves_the_transaction_usable(staff, tmp_path):
    run = _finished_run(tmp_path)
    client = Client()
    client.force_login(staff)
    data = {**_serve_data(client, run), "profile": None}
    adapter = serving.servable(run)[0]
    with transaction.atomic():
        first = serving.serve(run, adapter, data)
        with pytest.raises(serving.NameTaken, match=f"named {data['name']} {TAKEN}"):
            serving.serve(run, adapter, data)
        assert list(InferenceModel.objects.all()) == [first]  # the request's transaction goes on
