from decimal import Decimal

import pytest

from runs.launch import example_recipe, launch


def tiny_recipe(**changes) -> dict:
    """The tiny example recipe the launch form starts with, with changes."""
    return {**example_recipe(), **changes}


@pytest.fixture
def launched(tmp_path):
    def make(name="tiny", budget=Decimal("50"), max_restarts=3, **kwargs):
        return launch(name=name, recipe=tiny_recipe(), bucket=str(tmp_path / "bucket"), budget_usd=budget,
                      max_restarts=max_restarts, **kwargs)
    return make


def put_on_a_box(run, *, now=None, supervised=True) -> str:
    """The run as the supervisor leaves it after renting: on a running box of its own, with that box's token (the
    supervisor having just finished a pass unless `supervised` is False)."""
    from django.utils import timezone

    from fleet.models import Instance
    from runs import pulse, tokens
    from runs.models import RunAttempt

    now = now or timezone.now()
    number = run.attempts.count()
    box = Instance.objects.create(provider="vast", idempotency_key=f"run-{run.pk}-attempt-{number}",
                                  label=f"run{run.pk}-box{number}", state=Instance.State.RUNNING, purpose="training",
                                  offer_id=str(number), gpu_name="H200", machine_id=f"m{run.pk}-{number}",
                                  image="img", disk_gb=50, requested_at=now, running_at=now,
                                  usd_per_hour=Decimal("1.00"))
    run.attempts.filter(ended_at=None).update(ended_at=now, end_reason="replaced")
    attempt = RunAttempt.objects.create(run=run, instance=box, started_at=now, token_nonce=tokens.new_nonce())
    type(run).objects.filter(pk=run.pk).update(current_instance=box)
    run.refresh_from_db()
    if supervised:
        pulse.record("supervisor", now)
    return tokens.issue(attempt, now=now)


def stored_checkpoint(run, phase: int, step: int) -> dict:
    """Writes a checkpoint into the run's local bucket as its current box uploads it (into its attempt's folder);
    returns the notice that declares it."""
    import hashlib
    from pathlib import Path

    uri = f"ckpt-p{phase:02d}-s{step:08d}"
    attempt = run.attempts.filter(ended_at=None).latest("started_at", "id")
    root = Path(run.bucket) / "runs" / str(run.pk) / "attempts" / str(attempt.pk) / uri
    data = f"adapter {phase} {step}".encode()
    (root / "adapter").mkdir(parents=True, exist_ok=True)
    (root / "adapter" / "adapter_model.safetensors").write_bytes(data)
    (root / "COMPLETE").write_text("done\n")
    manifest = {"adapter/adapter_model.safetensors": {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}}
    return {"phase": phase, "step": step, "uri": uri, "complete": True, "manifest": manifest}


@pytest.fixture
def alice(django_user_model):
    """A user who launches runs (staff, as the launch permission asks), the owner in the sharing tests."""
    return django_user_model.objects.create_user("alice", password="alice-pass-123", is_staff=True)


@pytest.fixture
def bob(django_user_model):
    """Another such user, who must not reach alice's work."""
    return django_user_model.objects.create_user("bob", password="bob-pass-123", is_staff=True)
