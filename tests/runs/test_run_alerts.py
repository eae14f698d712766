"""A run's last alert names how it ended: an operator's cancel is not a failure."""

from decimal import Decimal

import pytest
from django.utils import timezone

from fleet.models import Alert
from runs import supervisor
from runs.models import Run


@pytest.mark.django_db
@pytest.mark.parametrize("state, kind", [("cancelled", "run.cancelled"), ("failed", "run.failed"),
                                         ("finished", "run.finished")])
def test_it_alerts_with_the_kind_of_the_runs_end(state, kind):
    now = timezone.now()
    run = Run.objects.create(name="ended", recipe={}, bucket="s3://bucket/runs", budget_usd=Decimal("5"),
                             token_nonce="n", state=state, state_reason="Cancelled by operator.", created_at=now,
                             finished_at=now)
    supervisor.supervise_run(run, now)
    assert list(Alert.objects.values_list("kind", flat=True)) == [kind]
