"""Every number a person types on the Offers page has a range, checked by the form, with the message next to the
field in the field's own words; a ranking that cannot be worked out says the table is not updated, and why."""

import re

import pytest
from django.urls import reverse

from fleet.models import OfferProfile
from fleet.offers.forms import RankingForm
from fleet.offers.refresh import refresh_offers
from fleet.ranking import OfferFilters, Workload

pytestmark = pytest.mark.django_db
INTERNAL = re.compile(r"__all__|checkpoint_interval_s|[a-z]+_[a-z_]+ (must|is)|got inf")


def _params(**changes) -> dict:
    data = RankingForm.data_for(Workload(), OfferFilters())
    data.update(changes)
    return {k: v for k, v in data.items() if v is not None and v is not False and v != ""}


@pytest.fixture
def listed(market):
    refresh_offers()


@pytest.mark.parametrize("field, value, label, words", [
    ("batch_size", "1000000000", "Batch size", "At most 65,536."),
    ("seq_len", "100000000000", "Sequence length", "At most 1,048,576."),
    ("max_usd_per_hour", "1e308", "Price cap $/h", "At most 1,000."),
    ("checkpoint_interval_min", "1e308", "Checkpoint every (min)", "At most 10,080."),
    ("min_disk_gb", "1e300", "Min disk GB", "At most 1,000,000."),
    ("grad_accum", "65536", "Batch size", "tokens a step; at most 67,108,864."),  # the product is too big
    ("phases", "sft:100000000000", "Phases", "a phase has at most 10,000,000 steps."),
    ("max_gpus", "1", "Max GPUs", "At least the min GPUs (2)."),
    ("active_params_b", "40", "Active params (B)", "At most the total params (35 B)."),
])
@pytest.mark.parametrize("htmx", [False, True])
def test_it_refuses_a_number_out_of_range_by_its_field(client, member, listed, field, value, label, words, htmx):
    client.force_login(member)
    params = _params(**{field: value, **({"min_gpus": "2"} if field == "max_gpus" else {})})
    response = client.get(reverse("offers"), params, **({"HTTP_HX_REQUEST": "true"} if htmx else {}))
    assert response.status_code == 200
    body = response.content.decode()
    assert 'id="ranked"' not in body  # no ranking of the refused values, and no old table kept
    assert "The ranking is not updated" in body
    summary = body.split('id="ranking-not-updated"', 1)[1].split("</div>", 1)[0]
    assert label in summary and words in summary
    beside = re.search(rf'<span class="field-error" id="error-{"batch_size" if label == "Batch size" else field}"'
                       rf'( hx-swap-oob="true")?>(.*?)</span></span>', body, re.S)
    assert beside and words in beside.group(2) and bool(beside.group(1)) == htmx
    assert not INTERNAL.search(body.split("<main>", 1)[-1]), INTERNAL.search(body).group()


def test_it_clears_a_fixed_fields_message_beside_it(client, member, listed):
    client.force_login(member)
    body = client.get(reverse("offers"), _params(), HTTP_HX_REQUEST="true").content.decode()
    assert 'id="ranked"' in body
    assert '<span class="field-error" id="error-seq_len" hx-swap-oob="true"></span>' in body


def test_it_names_the_field_when_a_profile_is_not_saved(client, staff, listed):
    client.force_login(staff)
    response = client.post(reverse("save_profile"), {**_params(seq_len="100000000000"), "profile_name": "huge"})
    text = response.content.decode()
    summary = text.split('id="profile-not-saved"', 1)[1].split("</div>", 1)[0]
    assert "Profile not saved" in summary and "Sequence length</a>: At most 1,048,576." in summary
    assert 'name="seq_len" value="100000000000"' in text  # what was typed, kept
    assert not OfferProfile.objects.exists() and "__all__" not in text
