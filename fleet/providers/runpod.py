"""RunPod over its GraphQL API, behind the same interface and records as the vast.ai client; what its API does not tell
is in docs/fleet.md, "fleet/providers/runpod.py"."""

import json
import logging
import re
import shlex
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import httpx

from . import fields, runpod_billing
from .base import ChargeReport, HttpProvider, InstanceList, OfferSearch, instance_list
from .errors import (
    AuthenticationFailed,
    EndpointRetired,
    InstanceNotFound,
    MalformedResponse,
    OfferUnavailable,
    ProviderError,
    RentAnswerUnreadable,
)
from .records import InstanceRecord, OfferRecord, RentRequest, VolumeRecord, readable
from .retrying import RetryingClient
from .runpod_terms import PodTerms

log = logging.getLogger(__name__)

CLOUD_TYPES = ("SECURE", "COMMUNITY")
STORAGE_USD_PER_GB_MONTH = Decimal("0.10")  # RunPod's published container/volume disk rate on a running pod
IDLE_VOLUME_USD_PER_GB_MONTH = Decimal("0.20")  # RunPod's published rate for the volume of a stopped pod
# RunPod's published network volume rate: $0.07/GB/month up to 1 TB, $0.05 for a volume over 1 TB (billed whether or
# not a pod mounts it).
NETWORK_VOLUME_USD_PER_GB_MONTH, NETWORK_VOLUME_LARGE_USD_PER_GB_MONTH = Decimal("0.07"), Decimal("0.05")
NETWORK_VOLUME_CLOUD = "SECURE"  # network volumes live in RunPod's own data centres: Secure Cloud only
HOURS_PER_MONTH = Decimal(730)
_STOPPED = ("EXITED", "STOPPED", "PAUSED")

# Compute capability (x10, like sm_90) per GPU model; RunPod lists the model, never the capability. Longest first.
_COMPUTE_CAPABILITY = (
    ("RTX PRO 6000", 120), ("RTX 5090", 120), ("B200", 100), ("H200", 90), ("H100", 90),
    ("L40S", 89), ("L40", 89), ("L4", 89), ("RTX 6000 ADA", 89), ("RTX 4090", 89),
    ("A100", 80), ("A40", 86), ("A6000", 86), ("RTX 3090", 86),
)

# How RunPod says that the GPU type has no free machine for the request (checked lowercased).
_NO_CAPACITY = (
    "no longer any instances available",
    "no instances available",
    "no instances currently available",
    "does not have the resources to deploy your pod",
    "not enough capacity",
    "insufficient capacity",
    "out of stock",
)
_AUTH_WORDS = ("unauthorized", "unauthenticated", "forbidden", "invalid api key", "api key is invalid")
# lastStatusChange words of a stop nobody asked for (checked lowercased; "user" wins over them).
_UNASKED_STOP_WORDS = ("runpod", "host", "interrupt", "outbid", "balance", "error")
_NOT_FOUND_WORDS = ("not found", "does not exist", "no pod", "could not find")

# lowestPrice once per cloud (without `secureCloud` RunPod merges both): its stockStatus says whether a machine of
# that count is free there now ("High", "Medium", "Low"; null when none is), and its prices stay set either way.
_GPU_TYPES_QUERY = """
query GpuTypes($gpuCount: Int!) {
  gpuTypes {
    id displayName memoryInGb maxGpuCount maxGpuCountSecureCloud maxGpuCountCommunityCloud minPodGpuCount
    secureCloud communityCloud securePrice communityPrice secureSpotPrice communitySpotPrice
    secureLowest: lowestPrice(input: {gpuCount: $gpuCount, secureCloud: true}) {
      minimumBidPrice uninterruptablePrice stockStatus
    }
    communityLowest: lowestPrice(input: {gpuCount: $gpuCount, secureCloud: false}) {
      minimumBidPrice uninterruptablePrice stockStatus
    }
  }
}"""

_POD_FIELDS = """
    id name desiredStatus lastStatusChange costPerHr gpuCount podType machineId imageName volumeInGb
    machine { gpuDisplayName }
    runtime {
      uptimeInSeconds
      ports { ip isIpPublic privatePort publicPort type }
      gpus { id gpuUtilPercent }
    }"""

_VOLUMES_QUERY = "query NetworkVolumes { myself { networkVolumes { id name size dataCenterId } } }"
_PODS_QUERY = "query Pods { myself { pods {" + _POD_FIELDS + "\n  } } }"
_POD_QUERY = "query Pod($podId: String!) { pod(input: {podId: $podId}) {" + _POD_FIELDS + "\n  } }"
_DEPLOY_MUTATION = """
mutation Deploy($input: PodFindAndDeployOnDemandInput!) {
  podFindAndDeployOnDemand(input: $input) { id machineId }
}"""
_BID_MUTATION = """
mutation Bid($input: PodRentInterruptableInput!) {
  podRentInterruptable(input: $input) { id machineId }
}"""
_TERMINATE_MUTATION = "mutation Terminate($podId: String!) { podTerminate(input: {podId: $podId}) }"


class QueryRefused(ProviderError):
    """RunPod answered the GraphQL call with an error that is neither about the key nor about capacity."""


class RunPodClient(HttpProvider):
    name = "runpod"

    def __init__(
        self,
        api_url: str,
        api_key: str,
        *,
        timeout_s: float = 20.0,
        max_retries: int = 4,
        backoff_s: float = 0.5,
        max_wait_s: float = 30.0,
        gpu_counts: tuple[int, ...] = (1,),
        ports: str = "22/tcp,8000/tcp",
        storage_usd_per_gb_month: Decimal = STORAGE_USD_PER_GB_MONTH,
        terms: PodTerms | None = None,
        sleep=time.sleep,
        transport: httpx.BaseTransport | None = None,
    ):
        self.api_url = api_url
        self.gpu_counts = tuple(gpu_counts)
        self.ports = ports
        self.storage_usd_per_gb_month = storage_usd_per_gb_month
        self.terms = terms or PodTerms()
        self._http = RetryingClient(provider="RunPod", key_variable="RUNPOD_API_KEY", api_key=api_key,
                                    timeout_s=timeout_s, max_retries=max_retries, backoff_s=backoff_s,
                                    max_wait_s=max_wait_s, sleep=sleep, transport=transport)

    # -- the provider interface ------------------------------------------------------------------------------

    def search_offers(self, filters: dict | None = None, *, bid: bool = False, limit: int = 1000) -> OfferSearch:
        """One offer per GPU type x cloud x GPU count, cheapest first.

        `filters` takes RunPod's own terms only: {"gpu_counts": [1, 8], "cloud_types": ["SECURE"]}; vast.ai's
        field filters mean nothing here and are refused rather than silently ignored.
        """
        filters = dict(filters or {})
        gpu_counts = tuple(filters.pop("gpu_counts", self.gpu_counts))
        cloud_types = tuple(filters.pop("cloud_types", CLOUD_TYPES))
        if filters:
            raise ValueError(f"RunPod offer search takes gpu_counts and cloud_types, not {sorted(filters)}.")
        result = OfferSearch()
        for gpu_count in gpu_counts:
            data = self._graphql("gpuTypes", _GPU_TYPES_QUERY, {"gpuCount": gpu_count})
            gpu_types = data.get("gpuTypes")
            if not isinstance(gpu_types, list):
                raise MalformedResponse("RunPod gpuTypes answered without a list of GPU types.")
            for raw in gpu_types:
                try:
                    result.extend(parse_offers(raw, gpu_count, cloud_types, bid=bid, terms=self.terms,
                                               storage_usd_per_gb_month=self.storage_usd_per_gb_month))
                except (TypeError, ValueError) as exc:  # fields.BadField is a ValueError that names the field
                    gpu_id = fields.label(raw.get("id", "?")) if isinstance(raw, dict) else "?"
                    result.skipped.append(f"GPU type {gpu_id} x{gpu_count}: {exc}")
        result.sort(key=lambda o: (o.total_usd_per_hour, o.offer_id))
        del result[limit:]
        if result.skipped:
            log.warning("Skipped %d malformed RunPod GPU types: %s", len(result.skipped), "; ".join(result.skipped[:5]))
        return result

    def rent(self, request: RentRequest) -> str:
        """Deploys a pod for an offer id "<gpu type>:<cloud>:<count>"; a bid rents it interruptible.

        The label becomes the pod's name, which is how a rent whose outcome is unknown is found again.
        """
        gpu_type_id, cloud_type, gpu_count = parse_offer_id(request.offer_id)
        env, ports = pod_ports(request.env, self.ports)
        pod = {
            "name": request.label,
            "imageName": request.image,
            "gpuTypeId": gpu_type_id,
            "cloudType": cloud_type,
            "gpuCount": gpu_count,
            "containerDiskInGb": request.disk_gb,
            "volumeInGb": 0,
            "env": [{"key": k, "value": v} for k, v in env.items()],
            "ports": ports,
            "supportPublicIp": True,
            "startSsh": True,
            **self.terms.deploy_fields(),  # the host floors each offer promises (runpod_terms)
        }
        if request.volume is not None:
            # The network volume is the pod's volume, mounted at the path asked; the pod is deployed in the volume's
            # data centre (RunPod places it there; the centre is sent too where it is known).
            if cloud_type != NETWORK_VOLUME_CLOUD:
                raise OfferUnavailable(f"Offer {request.offer_id}: a network volume mounts only in RunPod's Secure "
                                       "Cloud.")
            pod["networkVolumeId"] = request.volume.volume_id
            pod["volumeMountPath"] = request.volume.mount_path
            if request.volume.data_center_id:
                pod["dataCenterId"] = request.volume.data_center_id
        if request.onstart:  # RunPod has no on-start script; the container's command runs it instead
            pod["dockerArgs"] = f"bash -c {shlex.quote(request.onstart)}"
        if request.bid_usd_per_hour is None:
            operation, mutation = "podFindAndDeployOnDemand", _DEPLOY_MUTATION
        else:
            # RentRequest's bid is for the whole machine, as on vast.ai; RunPod takes it per GPU.
            operation, mutation = "podRentInterruptable", _BID_MUTATION
            pod["bidPerGpu"] = float(request.bid_usd_per_hour / gpu_count)
        what = f"RunPod {operation} for offer {request.offer_id}"
        try:
            data = self._graphql(operation, mutation, {"input": pod}, idempotent=False)
        except MalformedResponse as exc:
            raise RentAnswerUnreadable(f"{what}: {exc} It may have rented: reconcile by label.") from None
        except OfferUnavailable as exc:
            raise OfferUnavailable(f"Offer {request.offer_id} can no longer be rented: {exc}") from None
        created = data.get(operation)
        pod_id = created.get("id") if isinstance(created, dict) else None
        if not isinstance(pod_id, str) or not pod_id:
            raise RentAnswerUnreadable(f"{what} answered without a pod id; it may have rented: reconcile by label.")
        return pod_id

    def list_volumes(self) -> list[VolumeRecord]:
        """The account's network volumes (`myself { networkVolumes { id name size dataCenterId } }`); one that cannot
        be read is logged and left out."""
        data = self._graphql("myself", _VOLUMES_QUERY)
        myself = data.get("myself")
        raw_volumes = myself.get("networkVolumes") if isinstance(myself, dict) else None
        if not isinstance(raw_volumes, list):
            raise MalformedResponse("RunPod myself answered without a list of network volumes.")
        return readable(raw_volumes, parse_network_volume, "RunPod listed a network volume")

    def list_instances(self) -> InstanceList:
        data = self._graphql("myself", _PODS_QUERY)
        myself = data.get("myself")
        pods = myself.get("pods") if isinstance(myself, dict) else None
        if not isinstance(pods, list):
            raise MalformedResponse("RunPod myself answered without a list of pods.")
        # A terminated pod is gone for good; vast.ai simply stops listing such instances, and so do we.
        return instance_list([raw for raw in pods if not (isinstance(raw, dict) and _is_terminated(raw))],
                             parse_pod, "RunPod", label_key="name")

    def get_instance(self, instance_id: str) -> InstanceRecord:
        try:
            data = self._graphql("pod", _POD_QUERY, {"podId": instance_id})
        except QueryRefused as exc:
            if _says_not_found(str(exc)):
                raise InstanceNotFound(f"RunPod has no pod {instance_id}.") from None
            raise
        raw = data.get("pod")
        if raw is None or (isinstance(raw, dict) and _is_terminated(raw)):
            raise InstanceNotFound(f"RunPod has no pod {instance_id}.")
        return parse_pod(raw)

    def destroy(self, instance_id: str) -> bool:
        """Terminates the pod; False if it was already gone (destroying twice is not an error).

        The pod is looked up first, because how RunPod answers a terminate for an unknown pod is not documented;
        a terminate that fails is followed by another look, so a pod that vanished meanwhile is not an error.
        """
        try:
            self.get_instance(instance_id)
        except InstanceNotFound:
            return False
        except MalformedResponse as exc:  # a pod we cannot read is still a pod we pay for: terminate it all the same
            log.warning("RunPod pod %s could not be read before its terminate: %s", instance_id, exc)
        try:
            self._graphql("podTerminate", _TERMINATE_MUTATION, {"podId": instance_id})
        except QueryRefused:
            try:
                self.get_instance(instance_id)
            except InstanceNotFound:
                return False
            raise
        return True

    def charges(self) -> ChargeReport:
        """Each pod's gpu, cpu and disk charges of the last months from REST API v2's pod billing (GraphQL has none);
        a pod with an unreadable record is named in `unreadable` and not reconciled."""
        what = "RunPod GET /v2/billing/pods"
        response = self._http.request("GET", runpod_billing.billing_url(self.api_url), what=what,
                                      params=runpod_billing.BILLING_QUERY)
        if response.status_code >= 400:
            body = _decode(response, what, strict=False)
            detail = body.get("detail") or body.get("title") or response.reason_phrase
            raise QueryRefused(f"{what}: HTTP {response.status_code}: {fields.shown(detail)}")
        report = runpod_billing.parse_billing(_decode(response, what))
        if report.skipped:
            log.error("RunPod billing: left out %d unreadable records, their pods not reconciled: %s",
                      len(report.skipped), "; ".join(report.skipped[:5]))
        return report

    # -- GraphQL over HTTP with retries ----------------------------------------------------------------------

    def _graphql(self, operation: str, query: str, variables: dict | None = None, *, idempotent: bool = True) -> dict:
        """Runs one query or mutation and returns its `data`; GraphQL `errors` become the product's errors."""
        response = self._request(operation, {"query": query, "variables": variables or {}}, idempotent=idempotent)
        what = f"RunPod {operation}"
        if response.status_code == 410:
            raise EndpointRetired(f"{what}: RunPod answered 410 Gone, so its GraphQL API is switched off for this "
                                  "account: its pods can be neither seen nor terminated from here. Terminate them in "
                                  "RunPod's console, and move this product to a release that speaks RunPod's newer "
                                  "API.")
        if response.status_code >= 400:
            # Refused as sent (GraphQL answers 400 to a query it cannot validate): nothing happened.
            message = _error_text(_decode(response, what, strict=False)) or response.reason_phrase
            raise _refusal(what, f"HTTP {response.status_code}: {message}")
        body = _decode(response, what)
        if body.get("errors"):
            raise _refusal(what, _error_text(body) or "an error without a message")
        data = body.get("data")
        if not isinstance(data, dict):
            raise MalformedResponse(f"{what} answered without a 'data' object.")
        return data

    def _request(self, operation: str, body: dict, *, idempotent: bool = True) -> httpx.Response:
        # A terminate is safe to repeat; a pod creation is not (RetryingClient raises OutcomeUnknown instead, and
        # the caller finds the pod again by its name, our label).
        return self._http.request("POST", self.api_url, what=f"RunPod {operation}", idempotent=idempotent,
                                  json=body)


def _decode(response: httpx.Response, what: str, *, strict: bool = True) -> dict:
    try:
        data = json.loads(response.content, parse_int=fields.json_int)
    except ValueError:
        if not strict:
            return {}
        raise MalformedResponse(f"{what} answered HTTP {response.status_code} with a body that is not JSON.") from None
    if not isinstance(data, dict):
        if not strict:
            return {}
        raise MalformedResponse(f"{what} answered JSON that is not an object.")
    return data


def _refusal(what: str, message: str) -> ProviderError:
    lowered = message.lower()
    if any(words in lowered for words in _AUTH_WORDS):
        return AuthenticationFailed(f"RunPod refused the API key ({message}): check RUNPOD_API_KEY.")
    if any(words in lowered for words in _NO_CAPACITY):
        return OfferUnavailable(f"RunPod has no capacity for it: {message}")
    return QueryRefused(f"{what}: {message}")


def _error_text(body: dict) -> str:
    errors = body.get("errors")
    if not isinstance(errors, list):
        return ""
    messages = [str(e.get("message")) for e in errors if isinstance(e, dict) and e.get("message")]
    return "; ".join(messages)


def _says_not_found(message: str) -> bool:
    lowered = message.lower()
    return any(words in lowered for words in _NOT_FOUND_WORDS)


def _is_terminated(raw: dict) -> bool:
    return str(raw.get("desiredStatus") or "").upper() == "TERMINATED"


# -- conversion: RunPod JSON -> records --------------------------------------------------------------------------


def offer_id(gpu_type_id: str, cloud_type: str, gpu_count: int) -> str:
    return f"{gpu_type_id}:{cloud_type}:{gpu_count}"


def parse_offer_id(value: str) -> tuple[str, str, int]:
    """"NVIDIA H200:SECURE:1" -> ("NVIDIA H200", "SECURE", 1); GPU type ids hold spaces but no colons."""
    parts = value.rsplit(":", 2)
    if len(parts) != 3 or not parts[0] or parts[1] not in CLOUD_TYPES or not parts[2].isdigit() or int(parts[2]) < 1:
        raise OfferUnavailable(f"Offer {value!r} is not a RunPod offer (GPU type:SECURE|COMMUNITY:count).")
    return parts[0], parts[1], int(parts[2])


def compute_capability(gpu_name: str) -> int:
    """The GPU model's compute capability x10; 0 (unknown) for a model not in the table."""
    upper = gpu_name.upper()
    for model, capability in _COMPUTE_CAPABILITY:
        if model in upper:
            return capability
    return 0


def _price(raw: dict, key: str) -> Decimal | None:
    price = fields.money(raw, key, default=None)
    return price if price else None  # RunPod reports 0 where it has no price


def in_stock(stock_status: str | None) -> bool:
    """RunPod's stockStatus as a yes or no: a level ("High", "Medium", "Low") is a machine free; null, empty or
    "None" is none."""
    return bool(stock_status and stock_status.strip().lower() not in ("none", "null", ""))


def parse_offers(raw: dict, gpu_count: int, cloud_types=CLOUD_TYPES, *, bid: bool = False,
                 terms: PodTerms | None = None,
                 storage_usd_per_gb_month: Decimal = STORAGE_USD_PER_GB_MONTH) -> list[OfferRecord]:
    """The offers one GPU type makes at one GPU count: one per cloud it is listed in, priced per machine, with the
    CUDA, driver, disk and bandwidth floors every rent sends (`terms`); a value that cannot be read raises BadField
    (docs/fleet.md, "RunPod offers")."""
    terms = terms or PodTerms()
    if not isinstance(raw, dict):
        raise TypeError("GPU type is not an object")
    gpu_type_id = fields.text(raw, "id", blank=False)
    if ":" in gpu_type_id:  # the offer id joins the type, the cloud and the count with colons
        raise fields.BadField("id", f"is {fields.shown(gpu_type_id)}, which holds a colon")
    memory = fields.number(raw, "memoryInGb")
    if not memory:
        raise fields.BadField("memoryInGb", "is 0")
    max_count = fields.whole(raw, "maxGpuCount", default=None)
    min_count = fields.whole(raw, "minPodGpuCount", default=None)
    if (max_count is not None and gpu_count > max_count) or (min_count is not None and gpu_count < min_count):
        return []
    name = fields.text(raw, "displayName", default="") or gpu_type_id
    offers = []
    for cloud in cloud_types:
        key = "secure" if cloud == "SECURE" else "community"
        if not fields.flag(raw, f"{key}Cloud", default=False):
            continue
        cloud_max = fields.whole(raw, f"maxGpuCount{key.title()}Cloud", default=None)
        if cloud_max is not None and gpu_count > cloud_max:
            continue
        lowest = raw.get(f"{key}Lowest") or {}
        if not isinstance(lowest, dict):
            raise fields.BadField(f"{key}Lowest", f"is {fields.shown(lowest)}, not an object")
        stock = fields.text(lowest, "stockStatus", default=None)
        on_demand = _price(raw, f"{key}Price") or _price(lowest, "uninterruptablePrice")
        spot = _price(raw, f"{key}SpotPrice") or _price(lowest, "minimumBidPrice")
        per_gpu = spot if bid else on_demand
        if per_gpu is None:
            if bid:
                continue  # this cloud takes no bids for the type: no offer, nothing malformed
            raise ValueError(f"no {key} price")
        machine = per_gpu * gpu_count
        offers.append(OfferRecord(
            provider="runpod",
            offer_id=offer_id(gpu_type_id, cloud, gpu_count),
            machine_id="",
            host_id="",
            gpu_name=name,
            num_gpus=gpu_count,
            gpu_ram_gb=float(memory),
            compute_capability=compute_capability(f"{gpu_type_id} {name}"),
            cuda_max=float(terms.cuda_floor),
            driver_version=terms.min_driver,
            disk_gb=float(terms.disk_gb),
            inet_up_mbps=float(terms.min_upload_mbps),
            inet_down_mbps=float(terms.min_download_mbps),
            inet_up_usd_per_gb=Decimal(0),  # RunPod does not bill traffic
            inet_down_usd_per_gb=Decimal(0),
            storage_usd_per_gb_month=storage_usd_per_gb_month,
            gpu_usd_per_hour=machine,
            total_usd_per_hour=machine,
            min_bid_usd_per_hour=None if spot is None else spot * gpu_count,
            reliability=terms.reliability.get(cloud, 0.0),
            verified=cloud == "SECURE",  # Secure Cloud is RunPod's vetted data-centre tier
            rentable=in_stock(stock),
            is_bid=bid,
            geolocation="",
            dlperf=None,
            total_flops=None,
        ))
    return offers


def network_volume_rate(size_gb: float) -> Decimal:
    """What RunPod bills a network volume of this size per GB and month (its published tiers)."""
    return NETWORK_VOLUME_LARGE_USD_PER_GB_MONTH if size_gb > 1000 else NETWORK_VOLUME_USD_PER_GB_MONTH


def parse_network_volume(raw: dict) -> VolumeRecord:
    """One network volume of `myself` as a record: RunPod lists its id, name, size (GB) and data centre, and no
    status: a listed volume is usable."""
    if not isinstance(raw, dict):
        raise TypeError("network volume is not an object")
    size_gb = fields.number(raw, "size")
    return VolumeRecord(
        provider="runpod",
        volume_id=fields.text(raw, "id", blank=False),
        name=fields.text(raw, "name", default="") or "",
        size_gb=size_gb,
        status="ready",
        usable=True,
        data_center_id=fields.text(raw, "dataCenterId", blank=False),
        storage_usd_per_gb_month=network_volume_rate(size_gb),
    )


# RunPod's desiredStatus -> vast.ai's actual_status words, which the rest of the product speaks.
_STATUS = {
    "CREATED": "created",
    "RESTARTING": "loading",
    "EXITED": "exited",
    "DEAD": "exited",
    "PAUSED": "stopped",
    "STOPPED": "stopped",
}


def pod_status(desired_status: str, has_runtime: bool) -> str:
    """RUNNING with a runtime is "running"; RUNNING without one is still pulling or starting: "loading"."""
    desired = desired_status.upper()
    if desired == "RUNNING":
        return "running" if has_runtime else "loading"
    return _STATUS.get(desired, desired.lower())


def intended_status(desired_status: str, is_bid: bool, last_status_change: str) -> str:
    """What the pod's owner wants, in vast.ai's words: a stop (desiredStatus EXITED, STOPPED, PAUSED) someone asked for
    (a user, or the box's self-stop) is "stopped"; one RunPod or the host made, or an interruptible pod's unexplained
    one (outbid), is "running", so the sync fails it (docs/fleet.md, "RunPod pod states")."""
    if desired_status.upper() not in _STOPPED:
        return "running"
    said = last_status_change.lower()
    if "user" in said:
        return "stopped"
    if is_bid or any(words in said for words in _UNASKED_STOP_WORDS):
        return "running"
    return "stopped"


def pod_ports(env: dict[str, str], ports: str) -> tuple[dict[str, str], str]:
    """(the environment without vast.ai's docker-style "-p 8000:8000" keys, the ports with each such container port
    added as TCP): a serving box asks for its port so, and RunPod takes ports only in its `ports` string."""
    wanted = [port.strip() for port in ports.split(",") if port.strip()]
    kept = {}
    for key, value in env.items():
        match = re.fullmatch(r"-p (\d{1,5}):(\d{1,5})", key.strip())
        if match is None:
            kept[key] = value
        elif f"{int(match.group(2))}/tcp" not in wanted:
            wanted.append(f"{int(match.group(2))}/tcp")
    return kept, ",".join(wanted)


def _public_ports(runtime: dict) -> tuple[str, dict[str, int], str, int | None]:
    """(public ip, {"8000/tcp": 41234}, ssh host, ssh port) from the runtime's port list; only public mappings."""
    public_ip, ports, ssh_host, ssh_port = "", {}, "", None
    for port in runtime.get("ports") or ():
        if not isinstance(port, dict) or not port.get("isIpPublic"):
            continue
        try:
            private, public = int(port["privatePort"]), int(port["publicPort"])
        except (KeyError, TypeError, ValueError, OverflowError):
            continue
        ip = str(port.get("ip") or "").strip()
        public_ip = public_ip or ip
        ports[f"{private}/{str(port.get('type') or 'tcp').lower()}"] = public
        if private == 22:
            ssh_host, ssh_port = ip, public
    return public_ip, ports, ssh_host, ssh_port


def _gpu_util(runtime: dict) -> float | None:
    values = [g.get("gpuUtilPercent") for g in runtime.get("gpus") or () if isinstance(g, dict)]
    numbers = [float(v) for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
    return sum(numbers) / len(numbers) if numbers else None


def parse_pod(raw: dict, *, now: datetime | None = None) -> InstanceRecord:
    """One pod of ours. Only a pod without an id is refused: a field that holds what it cannot is left unknown (the
    price as None, never 0) and named in the record's problems, as for vast.ai (vast.parse_instance)."""
    if not isinstance(raw, dict) or not isinstance(raw.get("id"), str) or not raw["id"].strip():
        raise MalformedResponse(f"RunPod returned a pod without an id{_id_shown(raw)}.")
    problems: list[str] = []

    def read(reader, source, key, fallback, **options):
        return fields.soft(source, problems, reader, key, fallback, **options)

    desired = fields.loose_text(raw.get("desiredStatus"), 100)
    is_bid = fields.loose_text(raw.get("podType"), 100).upper() == "INTERRUPTABLE"
    runtime = raw.get("runtime")
    if runtime is not None and not isinstance(runtime, dict):
        problems.append(f"runtime is {fields.shown(runtime)}, not an object")
        runtime = None
    public_ip, ports, ssh_host, ssh_port = _public_ports(runtime or {})
    machine = raw.get("machine")
    machine = machine if isinstance(machine, dict) else {}
    uptime = read(fields.number, runtime or {}, "uptimeInSeconds", None, high=10 * 365 * 86400, default=None)
    started_at = None
    if uptime is not None:
        started_at = (now or datetime.now(UTC)).replace(microsecond=0) - timedelta(seconds=int(uptime))
    return InstanceRecord(
        provider="runpod",
        instance_id=fields.loose_text(raw["id"], 100),
        label=fields.loose_text(raw.get("name"), 200),
        status=pod_status(desired, runtime is not None),
        status_msg=fields.loose_text(raw.get("lastStatusChange")),
        intended_status=intended_status(desired, is_bid, fields.loose_text(raw.get("lastStatusChange"))),
        is_bid=is_bid,
        gpu_name=fields.loose_text(machine.get("gpuDisplayName"), 200),
        num_gpus=read(fields.whole, raw, "gpuCount", 0, high=1024, default=0),
        machine_id=fields.loose_text(raw.get("machineId"), 100),
        usd_per_hour=read(fields.money, raw, "costPerHr", None, default=None),
        gpu_util_percent=_gpu_util(runtime or {}),
        public_ip=public_ip,
        ports=ports,
        ssh_host=ssh_host,
        ssh_port=ssh_port,
        started_at=started_at,
        problems=tuple(problems),
        billing_usd_per_hour=_stopped_rate(desired, runtime, read(fields.number, raw, "volumeInGb", None,
                                                                  high=1_000_000, default=None)),
    )


def _stopped_rate(desired: str, runtime, volume_gb: float | None) -> Decimal | None:
    """What a stopped pod bills per hour: its volume alone at RunPod's idle rate (its container disk and GPU bill only
    while it runs); None for a pod that is not stopped, or whose volume could not be read (its price stands)."""
    if desired.upper() not in _STOPPED or runtime is not None or volume_gb is None:
        return None
    return (Decimal(str(volume_gb)) * IDLE_VOLUME_USD_PER_GB_MONTH / HOURS_PER_MONTH).quantize(Decimal("0.000001"))


def _id_shown(raw) -> str:
    return f" ({fields.shown(raw.get('id'))})" if isinstance(raw, dict) and raw.get("id") is not None else ""
