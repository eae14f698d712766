"""RunPod's per-pod billing as charge lines: REST API v2's GET /v2/billing/pods (RunPod's GraphQL API has no per-pod
charges), read as strictly as vast.ai's charge report (docs/fleet.md, "RunPod charges")."""

from datetime import UTC, datetime
from decimal import Decimal
from urllib.parse import urlsplit

from . import fields
from .base import ChargeReport
from .errors import MalformedResponse
from .records import ChargeRecord

BILLING_PATH = "/v2/billing/pods"
# Three month buckets: every pod of ours that billed in the last two to three months, one record per pod and month.
BILLING_QUERY = {"bucketSize": "month", "lastN": 3}
KINDS = (("gpuAmount", "gpu"), ("cpuAmount", "cpu"), ("diskAmount", "disk"))
TOTAL_SLACK_USD = Decimal("0.01")  # a record whose parts miss its total by more than this is not read


def billing_url(graphql_url: str) -> str:
    """REST API v2 lives on the GraphQL API's own host: https://api.runpod.io/graphql -> .../v2/billing/pods."""
    parts = urlsplit(graphql_url)
    return f"{parts.scheme}://{parts.netloc}{BILLING_PATH}"


def parse_billing(body) -> ChargeReport:
    """The answer's records as gpu, cpu and disk lines per pod; a pod with a record that cannot be read gives none
    of its lines and is named in `unreadable`, so its total is not reconciled short."""
    if not isinstance(body, dict) or not isinstance(body.get("records"), list):
        raise MalformedResponse("RunPod billing answered without a 'records' list.")
    records = body["records"]
    metadata = body.get("metadata")
    count = metadata.get("recordCount") if isinstance(metadata, dict) else None
    if count is not None and count != len(records):
        raise MalformedResponse(f"RunPod billing says {fields.shown(count)} records and gave {len(records)}: it "
                                "cannot be read whole.")
    report = ChargeReport()
    lines: dict[str, list[ChargeRecord]] = {}
    for raw in records:
        pod_id = raw.get("podId") if isinstance(raw, dict) else None
        try:
            parsed = parse_record(raw)
        except (MalformedResponse, ValueError, TypeError) as exc:
            why = f"RunPod billing record {fields.shown(raw)}: {exc}"
            report.skipped.append(why)
            if isinstance(pod_id, str) and pod_id.strip():
                report.unreadable.setdefault(pod_id.strip(), why)
            continue
        lines.setdefault(parsed[0].instance_id, []).extend(parsed)
    for pod_id, pod_lines in lines.items():
        if pod_id not in report.unreadable:
            report.extend(pod_lines)
    return report


def parse_record(raw) -> list[ChargeRecord]:
    """One pod's record for one bucket as its gpu, cpu and disk lines (zero ones too: a pod billed nothing is
    reconciled at 0)."""
    if not isinstance(raw, dict):
        raise MalformedResponse("is not an object")
    pod_id = fields.text(raw, "podId", blank=False)
    start, end = _moment(raw, "startTime"), _moment(raw, "endTime")
    if end <= start:
        raise fields.BadField("endTime", "is not after startTime")
    amounts = {kind: fields.money(raw, key) for key, kind in KINDS}
    total = fields.money(raw, "totalAmount")
    if abs(sum(amounts.values()) - total) > TOTAL_SLACK_USD:
        raise fields.BadField("totalAmount", f"is {total}, not the sum of its parts ({sum(amounts.values())})")
    return [ChargeRecord(provider="runpod", instance_id=pod_id, kind=kind, amount_usd=amount, start=start, end=end)
            for kind, amount in amounts.items()]


def _moment(raw: dict, key: str) -> datetime:
    value = fields.text(raw, key, blank=False)
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise fields.BadField(key, f"is {fields.shown(value)}, not an RFC 3339 time") from None
    if moment.tzinfo is None:
        raise fields.BadField(key, "has no time zone")
    return moment.astimezone(UTC)
