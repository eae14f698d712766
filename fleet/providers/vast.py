"""vast.ai over its REST API (https://console.vast.ai/api/v0), also the client of the simulated marketplace.

Every response is converted here, once, into plain records with units in their field names.
"""

import json
import logging
import re
from datetime import UTC, datetime
from decimal import Decimal

import httpx

from . import fields
from .base import ChargeReport, HttpProvider, InstanceList, OfferSearch, instance_list
from .errors import (AuthenticationFailed, InstanceNotFound, MalformedResponse, OfferUnavailable, RequestRefused,
                     RentAnswerUnreadable)
from .records import ChargeRecord, InstanceRecord, OfferRecord, RentRequest, VolumeRecord, readable
from .retrying import AUTH_ERROR_CODES, RetryingClient

log = logging.getLogger(__name__)

MIB_PER_GIB = 1024
INSTANCE_PAGE = 25  # the most vast.ai's v1 instance list gives a page
CHARGE_PAGE = 100  # results (instances) a page of the charge report
CHARGE_DAYS = 60  # how far back the charge report reaches (it needs a day range)
MAX_PAGES = 400  # of a paged answer: past that it is taken for a server that never ends it
# vast.ai's documented limits on a rent (create_instance's x-input-validation), checked before it is sent: past them
# vast.ai answers 400 invalid_args, which says less than these do.
ENV_ENTRY_MAX = 256  # one environment variable, name and value
ENV_TOTAL_MAX = 32768  # all of them
START_MAX = 4096  # onstart, args and args_str together
LABEL_MAX, IMAGE_MAX = 256, 1024
BID_RANGE = (0.001, 128.0)  # $/h
# vast.ai's volume list says a volume's state in `status` without documenting its words: these are the ones a box may
# mount (a contract in force); any other ("offline", "deleting", ...) is shown to the user and refused.
USABLE_VOLUME_STATUSES = ("running", "active", "ready", "available")
MOUNT_PATH = re.compile(r"/[A-Za-z0-9._/-]{0,254}")  # the CLI's VALID_MOUNT_PATH, an absolute Linux path
# A rent sent within 4.5 s of the last one is refused with a 12 s penalty, and the 429 carries no Retry-After.
RENT_RATE_LIMIT_WAIT_S = 12.0


class VastClient(HttpProvider):
    name = "vast"

    def __init__(self, api_url: str, api_key: str, **http_options):
        """http_options: timeout_s, max_retries, backoff_s, max_wait_s, sleep, transport (see RetryingClient)."""
        self.api_url = api_url.rstrip("/")
        # The instance list lives under /api/v1 (/api/v0/instances/ answers 410 deprecated_endpoint since 2026);
        # one instance, renting, destroying and searching stay under /api/v0.
        if not self.api_url.endswith("/v0"):
            raise ValueError(f"the vast.ai API URL must end in /api/v0 (VAST_API_URL), not {self.api_url!r}")
        self.v1_url = self.api_url.removesuffix("/v0") + "/v1"
        self._http = RetryingClient(provider="vast.ai", key_variable="VAST_API_KEY", api_key=api_key,
                                    base_url=self.api_url, **http_options)

    # -- the provider interface ------------------------------------------------------------------------------

    def search_offers(self, filters: dict | None = None, *, bid: bool = False, limit: int = 1000) -> OfferSearch:
        body = {"rentable": {"eq": True}, **(filters or {})}
        body.setdefault("order", [["dph_total", "asc"]])
        body["type"] = "bid" if bid else "on-demand"
        body["limit"] = limit
        data = self._json("POST", "/bundles/", json=body)
        raw_offers = data.get("offers")
        if not isinstance(raw_offers, list):
            raise MalformedResponse("vast.ai offer search answered without an 'offers' list.")
        result = OfferSearch()
        for raw in raw_offers:
            try:
                result.append(parse_offer(raw, is_bid=bid))
            except (TypeError, ValueError) as exc:  # fields.BadField is a ValueError that names the field
                offer_id = fields.label(raw.get("id", "?")) if isinstance(raw, dict) else "?"
                result.skipped.append(f"offer {offer_id}: {exc}")
        if result.skipped:
            log.warning("Skipped %d malformed vast.ai offers: %s", len(result.skipped), "; ".join(result.skipped[:5]))
        return result

    def rent(self, request: RentRequest) -> str:
        problem = rent_request_problem(request)
        if problem:
            raise RequestRefused(f"vast.ai would refuse the rent of offer {request.offer_id}: {problem}.")
        body = {
            "client_id": "me",
            "image": request.image,
            "env": request.env,
            "disk": request.disk_gb,
            "label": request.label,
            "onstart": request.onstart,
            "runtype": "ssh",
        }
        if request.bid_usd_per_hour is not None:
            body["price"] = float(request.bid_usd_per_hour)
        if request.volume is not None:  # an existing volume linked at its mount path, as the CLI's --link-volume
            body["volume_info"] = {"mount_path": request.volume.mount_path, "create_new": False,
                                   "volume_id": int(request.volume.volume_id)}
        response = self._request("PUT", f"/asks/{request.offer_id}/", json=body, idempotent=False,
                                 rate_limit_wait_s=RENT_RATE_LIMIT_WAIT_S)
        data = _decode(response, strict=False)
        made = _contract(data)
        if made is not None and (response.status_code >= 400 or data.get("success") is False):
            # vast.ai can refuse a rent (a bid under the price) after creating its instance, stopped, billing disk.
            raise RentAnswerUnreadable(f"vast.ai refused the rent of offer {request.offer_id} yet made instance "
                                       f"{made}: reconcile by label.")
        if response.status_code in (400, 403, 404, 410) or data.get("success") is False:
            message = fields.loose_text(data.get("msg") or data.get("error"), 300) or f"HTTP {response.status_code}"
            if response.status_code in (400, 403) and data.get("error") == "invalid_args":
                raise RequestRefused(f"vast.ai refused the rent of offer {request.offer_id}: {message}")
            raise OfferUnavailable(f"Offer {request.offer_id} can no longer be rented: {message}")
        _raise_for_status(response)
        if made is None:
            # Accepted, so it may well have rented: the caller finds the machine by its label, not a second rent.
            raise RentAnswerUnreadable(f"vast.ai accepted the rent of offer {request.offer_id} (HTTP "
                                       f"{response.status_code}) but its answer names no instance; it may have "
                                       "rented: reconcile by label.")
        return str(made)

    def list_instances(self) -> InstanceList:
        """Every machine of ours, from vast.ai's paged list (/api/v1/instances/), 25 a page in id order."""
        params = {"limit": INSTANCE_PAGE, "order_by": '[{"col": "id", "dir": "asc"}]'}
        return instance_list(self._pages(f"{self.v1_url}/instances/", params, "instances", "instance list"),
                             parse_instance, "vast.ai")

    def get_instance(self, instance_id: str) -> InstanceRecord:
        # owner=me as vast.ai's own CLI sends it: the instance looked up among ours, not any the key could see.
        response = self._request("GET", f"/instances/{instance_id}/", params={"owner": "me"})
        if response.status_code == 404:
            raise InstanceNotFound(f"vast.ai has no instance {instance_id}.")
        _raise_for_status(response)
        raw = _decode(response).get("instances")
        if raw is None:  # vast.ai answers {"instances": null} for an id it does not know
            raise InstanceNotFound(f"vast.ai has no instance {instance_id}.")
        return parse_instance(raw)

    def destroy(self, instance_id: str) -> bool:
        """Destroys the instance; False if it was already gone (destroying twice is not an error)."""
        response = self._request("DELETE", f"/instances/{instance_id}/")
        if response.status_code == 404:
            return False
        _raise_for_status(response)
        if not response.is_success:  # a redirect (never followed) is no destroy
            raise MalformedResponse(f"vast.ai answered the destroy of instance {instance_id} with HTTP "
                                    f"{response.status_code}.")
        data = _decode(response, strict=False)
        if data.get("success") is False:
            raise MalformedResponse(f"vast.ai did not destroy instance {instance_id}: "
                                    f"{fields.loose_text(data.get('msg') or data.get('error'), 300) or 'no reason'}")
        return True

    def list_volumes(self) -> list[VolumeRecord]:
        """The account's volumes, as the CLI's `show volumes` asks (`GET /volumes?owner=me&type=all_volume`); one
        that cannot be read is logged and left out."""
        data = self._json("GET", "/volumes/", params={"owner": "me", "type": "all_volume"})
        raw_volumes = data.get("volumes")
        if not isinstance(raw_volumes, list):
            raise MalformedResponse("vast.ai volume list answered without a 'volumes' list.")
        return readable(raw_volumes, parse_volume, "vast.ai listed a volume")

    def change_bid(self, instance_id: str, usd_per_hour: Decimal) -> None:
        """An interruptible instance's new bid for the machine ($/h), as the CLI's `change bid` sends it; an outbid
        one at or above the bid to beat starts again."""
        if not BID_RANGE[0] <= float(usd_per_hour) <= BID_RANGE[1]:
            raise RequestRefused(f"a bid of ${usd_per_hour}/h is outside ${BID_RANGE[0]:g}-{BID_RANGE[1]:g}/h")
        self._command("PUT", f"/instances/bid_price/{instance_id}/", {"client_id": "me", "price": float(usd_per_hour)},
                      f"change the bid of instance {instance_id}")

    def reboot(self, instance_id: str) -> None:
        """Stops and starts the instance's container on the same machine (it keeps its GPUs)."""
        self._command("PUT", f"/instances/reboot/{instance_id}/", {}, f"reboot instance {instance_id}")

    def charges(self, *, days: int = CHARGE_DAYS) -> ChargeReport:
        """The charge lines of our instances created in the last `days`, per instance; a result with an unreadable line
        gives none of its lines and is named in `unreadable`."""
        now = datetime.now(UTC).timestamp()
        filters = json.dumps({"day": {"gte": int(now - days * 86400), "lte": int(now + 86400)}})
        results = self._pages("/charges/", {"select_filters": filters, "limit": CHARGE_PAGE}, "results", "charges")
        report = ChargeReport()
        for result in results:
            try:
                report.extend(parse_charges(result))
            except MalformedResponse as exc:
                instance_id = charged_instance(result)
                if instance_id is not None:
                    report.unreadable.setdefault(instance_id, str(exc))
                report.skipped.append(str(exc))
        if report.skipped:
            log.error("vast.ai charge report: left out %d unreadable results, their instances not reconciled: %s",
                      len(report.skipped), "; ".join(report.skipped[:5]))
        return report

    # -- HTTP with retries -----------------------------------------------------------------------------------

    def _command(self, method: str, path: str, body: dict, what: str) -> None:
        """A change to one instance: 404 is InstanceNotFound, a refusal (400, or success false) RequestRefused."""
        response = self._request(method, path, json=body, idempotent=True)
        data = _decode(response, strict=False)
        message = fields.loose_text(data.get("msg") or data.get("error"), 300) or f"HTTP {response.status_code}"
        if response.status_code == 404:
            raise InstanceNotFound(f"vast.ai could not {what}: {message}")
        if response.status_code in (400, 403) or data.get("success") is False:
            raise RequestRefused(f"vast.ai refused to {what}: {message}")
        _raise_for_status(response)

    def _json(self, method: str, path: str, **kwargs) -> dict:
        response = self._request(method, path, **kwargs)
        _raise_for_status(response)
        return _decode(response)

    def _pages(self, path: str, params: dict, key: str, what: str) -> list:
        """Every entry of a paged answer (its `key` list), each page asked for with the previous one's next_token
        until one comes without it. One that repeats a token, or gives an empty page with one, or never ends, is
        refused: a list cut short would make what is past it look gone."""
        entries, token, tokens = [], None, set()
        for _ in range(MAX_PAGES):
            data = self._json("GET", path, params={**params, **({"after_token": token} if token else {})})
            page = data.get(key)
            if not isinstance(page, list):
                raise MalformedResponse(f"vast.ai {what} answered without a '{key}' list.")
            entries += page
            token = data.get("next_token")
            if token is None or token == "":
                return entries
            if not isinstance(token, str) or token in tokens or not page:
                raise MalformedResponse(f"vast.ai {what} gave a page token it had given before, or an empty page "
                                        "with a token: it cannot be read to its end.")
            tokens.add(token)
        raise MalformedResponse(f"vast.ai {what} did not end after {MAX_PAGES} pages.")

    def _request(self, method: str, path: str, *, idempotent: bool = True, **kwargs) -> httpx.Response:
        response = self._http.request(method, path, what=f"vast.ai {method} {path}", idempotent=idempotent,
                                      **kwargs)
        _refused_key(response)
        return response


def rent_request_problem(request: RentRequest) -> str:
    """Why vast.ai would refuse this rent for its arguments (its documented limits), or ""."""
    lengths = {str(key): len(str(key)) + len(str(value)) + 1 for key, value in request.env.items()}
    longest = max(lengths, key=lengths.__getitem__, default=None)
    if longest is not None and lengths[longest] > ENV_ENTRY_MAX:
        return f"the environment variable {longest[:40]} is {lengths[longest]} characters, over {ENV_ENTRY_MAX}"
    if sum(lengths.values()) > ENV_TOTAL_MAX:
        return f"its environment is {sum(lengths.values())} characters, over {ENV_TOTAL_MAX}"
    if len(request.onstart) > START_MAX:
        return f"its start script is {len(request.onstart)} characters, over {START_MAX}"
    if len(request.label) > LABEL_MAX or len(request.image) > IMAGE_MAX:
        return f"its label or image name is over {LABEL_MAX} or {IMAGE_MAX} characters"
    if request.volume is not None:
        if not request.volume.volume_id.isdigit():
            return f"volume {request.volume.volume_id[:40]!r} is no vast.ai volume id (a number)"
        if not MOUNT_PATH.fullmatch(request.volume.mount_path):
            return f"the mount path {request.volume.mount_path[:80]!r} is not an absolute Linux path"
    bid = request.bid_usd_per_hour
    if bid is not None and not BID_RANGE[0] <= float(bid) <= BID_RANGE[1]:
        return f"a bid of ${float(bid):g}/h is outside ${BID_RANGE[0]:g}-{BID_RANGE[1]:g}/h"
    return ""


def _contract(data: dict) -> int | None:
    """The instance a rent answer names (new_contract), or None where it names none."""
    made = data.get("new_contract")
    return made if isinstance(made, int) and not isinstance(made, bool) and made > 0 else None


def _refused_key(response: httpx.Response) -> None:
    """vast.ai answers a wrong or revoked key on some paths with HTTP 404 and {"error": "auth_error"}: that is no
    machine gone, and no offer gone, but a key to fix (checked on every answer, in `_request`)."""
    if 400 <= response.status_code < 500:
        data = _decode(response, strict=False)
        if str(data.get("error")).lower() in AUTH_ERROR_CODES:
            raise AuthenticationFailed(f"vast.ai refused the API key (HTTP {response.status_code}: "
                                       f"{fields.loose_text(data.get('msg'), 200) or data['error']}): check "
                                       "VAST_API_KEY.")


def _raise_for_status(response: httpx.Response) -> None:
    if response.status_code >= 400:
        data = _decode(response, strict=False)
        message = data.get("msg") or data.get("error") or response.reason_phrase
        raise MalformedResponse(f"vast.ai {response.request.method} {response.request.url.path}: "
                                f"HTTP {response.status_code}: {message}")


def _decode(response: httpx.Response, *, strict: bool = True) -> dict:
    try:
        data = json.loads(response.content, parse_int=fields.json_int)
    except ValueError:
        if not strict:
            return {}
        raise MalformedResponse(
            f"vast.ai {response.request.method} {response.request.url.path} answered HTTP {response.status_code} "
            "with a body that is not JSON."
        ) from None
    if not isinstance(data, dict):
        if not strict:
            return {}
        raise MalformedResponse(f"vast.ai {response.request.url.path} answered JSON that is not an object.")
    return data


# -- conversion: marketplace JSON -> records ---------------------------------------------------------------------


def _timestamp(value) -> datetime | None:
    if value is None or isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        return datetime.fromtimestamp(value, tz=UTC)
    except (OverflowError, OSError, ValueError):  # NaN, an infinity, or a year no calendar here holds
        return None


def _verified(raw: dict) -> bool:
    """vast.ai's search says it as `verification` ("verified", "unverified", "deverified"); older answers and some
    proxies as a `verified` flag, read where it is given."""
    if raw.get("verified") is not None:
        return fields.flag(raw, "verified")
    verification = fields.text(raw, "verification", default="")
    return verification.lower() == "verified"


def parse_offer(raw: dict, *, is_bid: bool = False) -> OfferRecord:
    """One listing of vast.ai's search as a record; BadField (naming the field) for anything it cannot hold."""
    if not isinstance(raw, dict):
        raise TypeError("offer is not an object")
    return OfferRecord(
        provider="vast",
        offer_id=str(fields.whole(raw, "id", low=1, high=fields.MAX_ID)),
        machine_id=fields.identifier(raw, "machine_id"),
        host_id=fields.identifier(raw, "host_id"),
        gpu_name=fields.text(raw, "gpu_name", blank=False),
        num_gpus=fields.whole(raw, "num_gpus", low=1),
        gpu_ram_gb=_gib(fields.number(raw, "gpu_ram")),
        compute_capability=int(round(fields.number(raw, "compute_cap") / 10)),
        cuda_max=fields.number(raw, "cuda_max_good", default=0.0),
        driver_version=fields.text(raw, "driver_version", default=""),
        disk_gb=fields.number(raw, "disk_space"),
        inet_up_mbps=fields.number(raw, "inet_up"),
        inet_down_mbps=fields.number(raw, "inet_down"),
        inet_up_usd_per_gb=fields.money(raw, "inet_up_cost", default=Decimal(0)),
        inet_down_usd_per_gb=fields.money(raw, "inet_down_cost", default=Decimal(0)),
        storage_usd_per_gb_month=fields.money(raw, "storage_cost", default=Decimal(0)),
        gpu_usd_per_hour=fields.money(raw, "dph_base"),
        total_usd_per_hour=fields.money(raw, "dph_total"),
        min_bid_usd_per_hour=fields.money(raw, "min_bid", default=None),
        reliability=fields.one_of(raw, ("reliability2", "reliability"), fields.number, high=1.0, default=0.0),
        verified=_verified(raw),
        rentable=fields.flag(raw, "rentable", default=True),
        is_bid=fields.flag(raw, "is_bid", default=is_bid),
        geolocation=fields.text(raw, "geolocation", default=""),
        dlperf=fields.number(raw, "dlperf", default=None),
        total_flops=fields.number(raw, "total_flops", default=None),
        nvlink_gb_s=fields.number(raw, "bw_nvlink", default=None),
        pcie_gb_s=fields.number(raw, "pcie_bw", default=None),
        datacenter=_datacenter(raw),
        gpu_mem_bw_gb_s=fields.number(raw, "gpu_mem_bw", default=None),
        cpu_ram_gb=_gib(fields.number(raw, "cpu_ram", default=None)),
    )


def _gib(mib):
    """A listing's MB (MiB) as GiB to a tenth; None as it is."""
    return None if mib is None else round(mib / MIB_PER_GIB, 1)


def parse_volume(raw: dict) -> VolumeRecord:
    """One volume of `show volumes` as a record: its id, name (`label`), size (`disk_space`, GB), status and the
    machine it lives on; BadField (naming the field) for anything it cannot hold."""
    if not isinstance(raw, dict):
        raise TypeError("volume is not an object")
    status = fields.text(raw, "status", default="")
    return VolumeRecord(
        provider="vast",
        volume_id=str(fields.whole(raw, "id", low=1, high=fields.MAX_ID)),
        name=fields.text(raw, "label", default="") or "",
        size_gb=fields.number(raw, "disk_space"),
        status=status,
        usable=status.lower() in USABLE_VOLUME_STATUSES,
        machine_id=fields.identifier(raw, "machine_id"),
        geolocation=fields.text(raw, "geolocation", default="") or "",
        storage_usd_per_gb_month=fields.money(raw, "storage_cost", default=None),
    )


def _datacenter(raw: dict) -> bool | None:
    """Whether the host is a datacenter, as the search says it (hosting_type 1; a `datacenter` flag where given)."""
    if raw.get("datacenter") is not None:
        return fields.flag(raw, "datacenter")
    kind = raw.get("hosting_type")
    if kind is None:
        return None
    return fields.whole(raw, "hosting_type", high=1000) == 1


def _ports(raw_ports) -> dict[str, int]:
    ports: dict[str, int] = {}
    if isinstance(raw_ports, dict):
        for container_port, bindings in raw_ports.items():
            if isinstance(bindings, list) and bindings and isinstance(bindings[0], dict):
                try:
                    ports[str(container_port)] = int(bindings[0]["HostPort"])
                except (KeyError, TypeError, ValueError, OverflowError):
                    continue
    return ports


def parse_instance(raw: dict) -> InstanceRecord:
    """One machine of ours as vast.ai lists it. Only an unreadable id refuses it: any other field that holds what it
    cannot is left unknown (a price as None, never 0) and named in the record's problems, so that one odd field
    neither hides the machine from the sync nor stops the sync for the others."""
    if not isinstance(raw, dict) or raw.get("id") is None:
        raise MalformedResponse("vast.ai returned an instance without an id.")
    try:
        instance_id = str(fields.whole(raw, "id", high=fields.MAX_ID))
    except fields.BadField as exc:
        raise MalformedResponse(f"vast.ai instance {fields.label(raw.get('id'))}: {exc}") from None
    problems: list[str] = []

    def read(reader, key, fallback, **options):
        return fields.soft(raw, problems, reader, key, fallback, **options)

    return InstanceRecord(
        provider="vast",
        instance_id=instance_id,
        label=fields.loose_text(raw.get("label"), 200),
        status=fields.loose_text(raw.get("actual_status"), 100),
        status_msg=fields.loose_text(raw.get("status_msg")),
        intended_status=fields.loose_text(raw.get("intended_status"), 100),
        is_bid=read(fields.flag, "is_bid", False, default=False),
        gpu_name=fields.loose_text(raw.get("gpu_name"), 200),
        num_gpus=read(fields.whole, "num_gpus", 0, high=1024, default=0),
        machine_id=read(fields.identifier, "machine_id", ""),
        usd_per_hour=read(fields.money, "dph_total", None, default=None),
        gpu_util_percent=read(fields.number, "gpu_util", None, low=None, default=None),
        public_ip=fields.loose_text(raw.get("public_ipaddr"), 100),
        ports=_ports(raw.get("ports")),
        ssh_host=fields.loose_text(raw.get("ssh_host"), 255),
        ssh_port=read(fields.whole, "ssh_port", None, high=65535, default=None) or None,
        started_at=_timestamp(raw.get("start_date")),
        problems=tuple(problems),
        billing_usd_per_hour=_billing_rate(raw),
        min_bid_usd_per_hour=read(fields.money, "min_bid", None, default=None),
    )


GPU_BILLED_STATUSES = ("running", "frozen")  # vast.ai bills GPU time in these; storage from creation to destroy


def _billing_rate(raw: dict) -> Decimal | None:
    """What the instance bills per hour now: dph_total while running, only its storage (dph_total - dph_base)
    while it is created, loading (pulling its image), stopped or exited; None where that cannot be read."""
    if raw.get("actual_status") in GPU_BILLED_STATUSES:
        return None
    unread: list[str] = []  # a price it cannot read is named once, by usd_per_hour's own reading
    total = fields.soft(raw, unread, fields.money, "dph_total", None, default=None)
    gpu = fields.soft(raw, unread, fields.money, "dph_base", None, default=None)
    if total is None or gpu is None or not gpu <= total:
        return None
    return total - gpu


def parse_charges(result: dict) -> list[ChargeRecord]:
    """One result of vast.ai's charge report as its lines: an instance's ("source": "instance-<id>", or its
    metadata's instance_id) gpu, disk and traffic items; a result of another kind (a volume, a serverless
    endpoint) holds none of ours and gives none."""
    if not isinstance(result, dict):
        raise MalformedResponse(f"vast.ai charge result {fields.shown(result)} is not an object.")
    if result.get("type") not in (None, "instance"):
        return []
    instance_id = charged_instance(result)
    if instance_id is None:
        raise MalformedResponse(f"vast.ai charge result {fields.shown(result.get('source'))} names no instance.")
    items = result.get("items")
    if not isinstance(items, list):
        raise MalformedResponse(f"vast.ai charges of instance {instance_id} come without their items.")
    return [parse_charge(item, instance_id) for item in items]


def charged_instance(result) -> str | None:
    """The instance a result of the charge report is for ("source": "instance-<id>", or its metadata's
    instance_id), or None where it names none."""
    if not isinstance(result, dict):
        return None
    match = re.fullmatch(r"instance-(\d+)", str(result.get("source") or ""))
    metadata = result.get("metadata")
    metadata = metadata if isinstance(metadata, dict) else {}
    instance_id = match.group(1) if match else metadata.get("instance_id")
    if not isinstance(instance_id, str | int) or isinstance(instance_id, bool) or not str(instance_id).isdigit():
        return None
    return str(instance_id)


def parse_charge(raw: dict, instance_id: str) -> ChargeRecord:
    try:
        start, end = _timestamp(raw["start"]), _timestamp(raw["end"])
        if start is None or end is None:
            raise ValueError("start/end are not timestamps")
        return ChargeRecord(
            provider="vast",
            instance_id=instance_id,
            kind=fields.text(raw, "type", blank=False),
            amount_usd=fields.money(raw, "amount"),
            start=start,
            end=end,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise MalformedResponse(f"vast.ai charge line {fields.shown(raw)} of instance {instance_id}: {exc}") from None
