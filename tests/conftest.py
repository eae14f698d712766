import os

# CPU runs of the Triton kernels go through Triton's interpreter, and it must be chosen before anything imports
# triton: a dashboard test that imports the trainer's modules is collected before tests/training's own conftest.
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
from django.contrib.auth.models import Permission

from tests.marketplace import _market_server, celery_worker, frozen_market, market, runpod_market  # noqa: F401


@pytest.fixture
def operator(django_user_model):
    return django_user_model.objects.create_superuser("operator", password="operator-pass-123")


@pytest.fixture
def member(django_user_model):
    """A logged-in user without staff rights: sees pages, may not rent or destroy."""
    return django_user_model.objects.create_user("member", password="member-pass-123")


@pytest.fixture
def staff(django_user_model):
    """Staff with every fleet permission, but not a superuser."""
    user = django_user_model.objects.create_user("staff", password="staff-pass-123", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="fleet"))
    return user


@pytest.fixture(autouse=True, scope="session")
def _local_buckets(tmp_path_factory):
    # The tests' boxes run on this machine (the simulated marketplace's, or the agent in a test), so a temporary
    # folder serves as their bucket (one lies under DATA_DIR); tests/runs/test_run_outputs.py checks the refusals.
    from django.conf import settings

    settings.LOCAL_BUCKETS = True
    settings.DATA_DIR = tmp_path_factory.getbasetemp()


@pytest.fixture(autouse=True, scope="session")
def _plain_static_storage():
    # The hashed-manifest storage needs collectstatic first; tests render pages from the source folders.
    from django.conf import settings

    settings.STORAGES = {**settings.STORAGES,
                         "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"}}
