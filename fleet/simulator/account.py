"""The account behind the API key: the user record, and the bills as vast.ai's invoice and charge reports show them
(docs/fleet.md, "fleet/simulator/account.py")."""

from . import billing
from .instances import Instance
from .pages import paginate
from .search import parse_filters, matching

USER_ID = 100001
CHARGE_NAMES = {"gpu": "GPU", "disk": "Storage", "bwu": "Internet upload", "bwd": "Internet download"}


def user(instances: list[Instance], now: float, started_at: float, starting_credit_usd: float) -> dict:
    spent = _spent(instances, now)
    return {
        "id": USER_ID,
        "username": "simulated",
        "fullname": "Simulated Operator",
        "email": "operator@simulated.invalid",
        "email_verified": True,
        "credit": round(starting_credit_usd - spent, 4),
        "balance": 0.0,
        "balance_threshold": 0.0,
        "balance_threshold_enabled": False,
        "can_pay": True,
        "has_billing": True,
        "has_payout": False,
        "billing_creditonly": True,
        "got_signup_credit": False,
        "password_resettable": False,
        "paypal_email": None,
        "ssh_key": None,
        "last4": None,
        "user": "simulated",
        "created_at": round(started_at, 3),
    }


def invoices_v0(instances: list[Instance], now: float, started_at: float, starting_credit_usd: float, *,
                since: float | None, until: float | None, include_charges: bool) -> dict:
    """`GET /users/me/invoices`: the deposit and one row per charge line, within [since, until] by timestamp."""
    rows = [_deposit_row(started_at, starting_credit_usd)]
    if include_charges:
        for instance in instances:
            for line in billing.charge_lines(instance, now):
                rows.append({
                    "id": f"{line['instance_id']}-{line['type']}",
                    "type": "charge",
                    "instance_id": line["instance_id"],
                    "description": f"Instance {line['instance_id']} {CHARGE_NAMES[line['type']]}",
                    "quantity": line["quantity"],
                    "rate": _rate(line),
                    "amount": line["amount"],
                    "timestamp": line["start"],  # when the charge began: a running one has no end yet
                })
    rows = [row for row in rows if (since is None or row["timestamp"] >= since)
            and (until is None or row["timestamp"] <= until)]
    spent = _spent(instances, now)
    return {"invoices": rows, "current": {"charges": round(spent, 4), "service_fee": 0.0, "total": round(spent, 4),
                                          "credit": round(starting_credit_usd - spent, 4)}}


def charges_report(instances: list[Instance], now: float, *, select_filters: dict, latest_first: bool, limit,
                   after_token) -> dict:
    """`GET /api/v0/charges/` as the v1 client asks for it: one result per instance, its charge lines as items."""
    results = []
    for instance in instances:
        lines = billing.charge_lines(instance, now)
        items = [{
            "type": line["type"],
            "source": None,
            "description": f"{CHARGE_NAMES[line['type']]}: {line['quantity']:g} at ${_rate(line):g}",
            "amount": line["amount"],
            "start": line["start"],
            "end": line["end"],
            "items": [],
            "metadata": {},
        } for line in lines]
        results.append({
            "type": "instance",
            "source": f"instance-{instance.id}",
            "description": f"{instance.offer.num_gpus}x {instance.offer.gpu.name} {instance.label}".strip(),
            "amount": round(sum(item["amount"] for item in items), 6),
            "start": round(instance.created_at, 3),
            "end": max(item["end"] for item in items),
            "day": round(instance.created_at, 3),
            "items": items,
            "metadata": {"instance_id": instance.id},
        })
    return _report(results, "day", select_filters, latest_first, limit, after_token)


def invoices_report(now: float, started_at: float, starting_credit_usd: float, *, select_filters: dict,
                    latest_first: bool, limit, after_token) -> dict:
    """`GET /api/v1/invoices/`: the account's deposits (the simulation takes no other payments)."""
    deposit = {
        "type": "credit",
        "source": "stripe_payments",
        "service": "stripe_payments",
        "description": "Starting credit",
        "amount": -starting_credit_usd,  # the CLI shows deposits with the sign turned
        "start": round(started_at, 3),
        "end": round(started_at, 3),
        "when": round(started_at, 3),
        "items": [],
        "metadata": {"invoice_id": USER_ID},
    }
    return _report([deposit], "when", select_filters, latest_first, limit, after_token)


def _report(results: list[dict], date_field: str, select_filters: dict, latest_first: bool, limit,
            after_token) -> dict:
    filtered = matching(results, parse_filters(select_filters))
    filtered.sort(key=lambda row: row[date_field], reverse=bool(latest_first))
    page, next_token = paginate(filtered, limit, after_token)
    return {"results": page, "count": len(page), "total": len(filtered), "next_token": next_token}


def _deposit_row(started_at: float, amount: float) -> dict:
    return {"id": "deposit-0", "type": "payment", "description": "Starting credit", "quantity": 1, "rate": amount,
            "amount": amount, "timestamp": round(started_at, 3)}


def _rate(line: dict) -> float:
    return round(line["amount"] / line["quantity"], 6) if line["quantity"] else 0.0


def _spent(instances: list[Instance], now: float) -> float:
    return sum(line["amount"] for instance in instances for line in billing.charge_lines(instance, now))
