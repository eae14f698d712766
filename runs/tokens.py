"""Agent tokens: one per attempt (one box of a run), signed with the server's key, never stored.

A token opens only its attempt, while that attempt is the run's current one, the run is active, the token unexpired
and neither nonce changed (docs/runs.md, "runs/tokens.py").
"""

import secrets
from datetime import datetime

from django.core import signing
from django.db.models import F
from django.utils import timezone

from runs import reports
from runs.models import Run, RunAttempt

_SIGNER = signing.Signer(salt="runs.agent-token.v2")


def new_nonce() -> str:
    return secrets.token_hex(16)


def issue(attempt: RunAttempt, *, now: datetime | None = None) -> str:
    """The token of an attempt, valid for the dead-man window from now (and renewed by every heartbeat)."""
    now = now or timezone.now()
    if not attempt.token_nonce:
        attempt.token_nonce = new_nonce()
    attempt.token_expires_at = reports.renewed_until(now)
    RunAttempt.objects.filter(pk=attempt.pk).update(token_nonce=attempt.token_nonce,
                                                    token_expires_at=attempt.token_expires_at)
    run = attempt.run
    return "run_" + _SIGNER.sign(f"{run.pk}.{run.token_nonce}.{attempt.pk}.{attempt.token_nonce}")


def attempt_for(token: str, *, now: datetime | None = None) -> RunAttempt | None:
    """The attempt a token opens now, with its run and instance loaded, or None."""
    if not token.startswith("run_"):
        return None
    try:
        value = _SIGNER.unsign(token[len("run_"):])
    except signing.BadSignature:
        return None
    parts = value.split(".")
    if len(parts) != 4 or not (parts[0].isdigit() and parts[2].isdigit()):
        return None
    run_pk, run_nonce, attempt_pk, attempt_nonce = int(parts[0]), parts[1], int(parts[2]), parts[3]
    if not attempt_nonce:
        return None
    return (RunAttempt.objects.select_related("run", "instance")
            .filter(pk=attempt_pk, run_id=run_pk, run__token_nonce=run_nonce, token_nonce=attempt_nonce,
                    ended_at=None, run__current_instance=F("instance"), token_expires_at__gt=now or timezone.now(),
                    run__state__in=Run.ACTIVE_STATES)
            .first())
