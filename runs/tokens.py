"""Per-run agent tokens: signed with the server's key, never stored. A token names its run and the run's current
nonce, so it opens only that run, and a new nonce revokes every token given out before."""

import secrets

from django.core import signing

from runs.models import Run

_SIGNER = signing.Signer(salt="runs.agent-token")


def new_nonce() -> str:
    return secrets.token_hex(16)


def issue(run: Run) -> str:
    return "run_" + _SIGNER.sign(f"{run.pk}.{run.token_nonce}")


def run_for(token: str) -> Run | None:
    if not token.startswith("run_"):
        return None
    try:
        value = _SIGNER.unsign(token[len("run_"):])
    except signing.BadSignature:
        return None
    pk, _, nonce = value.partition(".")
    if not pk.isdigit():
        return None
    return Run.objects.filter(pk=int(pk), token_nonce=nonce).first()
