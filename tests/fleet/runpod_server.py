"""A stand-in for RunPod's GraphQL API: a real HTTP server on a free loopback port, in a thread of the test process.

It executes GraphQL for real (graphql-core) against a schema that is the subset of RunPod's public one that its
clients use: the product's (documents with `variables`) and the official `runpod` SDK's (arguments written inline,
`null` literals, selection sets of its own). A document that asks for a field the schema lacks is refused with HTTP
400 and GraphQL's own message, as RunPod's server does; only the selected fields come back.
Like RunPod it answers a wrong key with HTTP 401, and a refused operation with HTTP 200, an `errors` list and the
field set to null. RunPod does not document every refusal's wording; the messages follow what its API was seen to say.

Operations: gpuTypes (optionally `input: {id}`), myself { id pubKey networkVolumes pods }, pod(input: {podId}),
podFindAndDeployOnDemand, podRentInterruptable, podStop, podResume, podTerminate, updateUserSettings. Pods live in
memory: a new pod is CREATED without a runtime; after `boot_polls` reads of it (or `advance()`) it is RUNNING with a
runtime (public ports, GPU utilisation). Stop makes it EXITED (desiredStatus too) without a runtime, resume RUNNING
again; terminate removes it, as RunPod stops listing terminated pods. A pod keeps the volume, mount path, ports and
network volume it was deployed with; a network volume (`add_network_volume`) pins the pod to its data centre, mounts
only in Secure Cloud, and is read back as the pod's networkVolume at its volumeMountPath.

Billing, as REST API v2's `GET /v2/billing/pods` (RunPod's GraphQL has no per-pod charges): records per pod per
bucket (gpuAmount, cpuAmount, diskAmount, totalAmount) with `metadata`; pods accrue only on `elapse(hours)`, GPU time
while running, disk from creation (container disk while running, the volume always), terminated pods included.

Faults for the next requests: `inject_faults(http_429=, retry_after_s=, http_5xx=, status_5xx=, apply_5xx=,
non_json=, no_data=)`; lasting ones: `retire()` (410 Gone), `corrupt_answers(mangle)`, `capacity_gone(gpu_type_id)`,
`kill_pod(pod_id)` (host died: the pod is gone), `set_pod(pod_id, ...)` (the host side changes a pod's state).
"""

import itertools
import json
import random
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs

from graphql import GraphQLError, build_schema, graphql_sync, parse, validate
from graphql.language import OperationDefinitionNode

RUNPOD_KEY = "test-runpod-key"
DISK_RUNNING_USD_GB_MONTH = 0.10  # container disk and volume of a running pod
VOLUME_IDLE_USD_GB_MONTH = 0.20  # the volume of a stopped pod
HOURS_PER_MONTH = 730
BUCKETS = ("hour", "day", "week", "month", "year")
NO_CAPACITY = ("There are no longer any instances available with the requested specifications. "
               "Please refresh and try again.")

# (id, displayName, memoryInGb, maxGpuCount, secure, community, securePrice, communityPrice, secureSpot, communitySpot)
CATALOGUE = (
    ("NVIDIA H200", "H200", 141, 8, True, True, 3.99, 3.59, 2.29, 1.99),
    ("NVIDIA H100 80GB HBM3", "H100 SXM", 80, 8, True, True, 2.99, 2.69, 1.75, 1.49),
    ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "RTX PRO 6000", 96, 4, True, False, 1.79, None, 1.09, None),
    ("NVIDIA B200", "B200", 180, 8, True, False, 5.99, None, None, None),
    ("NVIDIA A100 80GB PCIe", "A100 PCIe", 80, 8, True, True, 1.64, 1.19, 0.82, 0.6),
    ("NVIDIA GeForce RTX 3070", "RTX 3070", 8, 1, False, False, None, None, None, None),  # listed, nowhere
)


SCHEMA = build_schema("""
scalar Void

enum CloudTypeEnum { ALL SECURE COMMUNITY }

type Query {
  myself: User
  pod(input: PodFilter!): Pod
  gpuTypes(input: GpuTypeFilter): [GpuType]
}

type Mutation {
  podFindAndDeployOnDemand(input: PodFindAndDeployOnDemandInput): Pod
  podRentInterruptable(input: PodRentInterruptableInput!): Pod
  podStop(input: PodStopInput!): Pod
  podResume(input: PodResumeInput!): Pod
  podTerminate(input: PodTerminateInput!): Void
  updateUserSettings(input: UpdateUserSettingsInput): User
}

input UpdateUserSettingsInput { pubKey: String }

input PodFilter { podId: String! }
input GpuTypeFilter { id: String }
input GpuLowestPriceInput { gpuCount: Int, minDownload: Int, minUpload: Int, secureCloud: Boolean }
input PodStopInput { podId: String!, incrementVersion: Boolean }
input PodResumeInput { podId: String!, gpuCount: Int! }
input PodTerminateInput { podId: String! }
input EnvironmentVariableInput { key: String!, value: String! }

input PodFindAndDeployOnDemandInput {
  name: String, imageName: String, gpuTypeId: String, cloudType: CloudTypeEnum, gpuCount: Int,
  containerDiskInGb: Int, volumeInGb: Int, volumeMountPath: String, env: [EnvironmentVariableInput],
  ports: String, supportPublicIp: Boolean, startSsh: Boolean, dockerArgs: String, dataCenterId: String,
  countryCode: String, minVcpuCount: Int, minMemoryInGb: Int, templateId: String, networkVolumeId: String,
  allowedCudaVersions: [String], minDownload: Int, minUpload: Int, instanceId: String
}

input PodRentInterruptableInput {
  bidPerGpu: Float!, name: String, imageName: String, gpuTypeId: String, cloudType: CloudTypeEnum,
  gpuCount: Int, containerDiskInGb: Int, volumeInGb: Int, volumeMountPath: String,
  env: [EnvironmentVariableInput], ports: String, supportPublicIp: Boolean, startSsh: Boolean,
  dockerArgs: String, dataCenterId: String, countryCode: String, minVcpuCount: Int, minMemoryInGb: Int,
  templateId: String, networkVolumeId: String, allowedCudaVersions: [String], minDownload: Int, minUpload: Int
}

type User { id: String, pubKey: String, networkVolumes: [NetworkVolume], pods: [Pod] }
type NetworkVolume { id: String, name: String, size: Int, dataCenterId: String }

type GpuType {
  id: String, displayName: String, manufacturer: String, memoryInGb: Int, cudaCores: Int, maxGpuCount: Int,
  maxGpuCountSecureCloud: Int, maxGpuCountCommunityCloud: Int, minPodGpuCount: Int,
  secureCloud: Boolean, communityCloud: Boolean, securePrice: Float, communityPrice: Float,
  secureSpotPrice: Float, communitySpotPrice: Float, oneWeekPrice: Float, oneMonthPrice: Float,
  threeMonthPrice: Float, lowestPrice(input: GpuLowestPriceInput): LowestPrice
}

type LowestPrice { minimumBidPrice: Float, uninterruptablePrice: Float, stockStatus: String }

type Pod {
  id: String!, name: String, desiredStatus: String, lastStatusChange: String, costPerHr: Float,
  gpuCount: Int, podType: String, machineId: String, imageName: String, containerDiskInGb: Int,
  dockerArgs: String, dockerId: String, env: [String], memoryInGb: Float, vcpuCount: Float, port: Int,
  ports: String, uptimeSeconds: Int, volumeInGb: Float, volumeMountPath: String, machine: Machine,
  runtime: PodRuntime, networkVolumeId: String, networkVolume: NetworkVolume, dataCenterId: String
}

type Machine { gpuDisplayName: String, podHostId: String }
type PodRuntime { uptimeInSeconds: Int, ports: [PodRuntimePort], gpus: [PodRuntimeGpu] }
type PodRuntimePort { ip: String, isIpPublic: Boolean, privatePort: Int, publicPort: Int, type: String }
type PodRuntimeGpu { id: String, gpuUtilPercent: Float, memoryUtilPercent: Float }
""")
MUTATIONS = {name for name in SCHEMA.mutation_type.fields}


@dataclass
class FakePod:
    id: str
    name: str
    gpu_type_id: str
    display_name: str
    cloud_type: str
    gpu_count: int
    cost_per_hr: float
    interruptible: bool
    image: str
    env: list
    ports: str | None
    machine_id: str
    container_disk_gb: int = 10
    volume_in_gb: int = 0
    volume_mount_path: str | None = None
    network_volume_id: str | None = None
    data_center_id: str = ""
    docker_args: str = ""
    desired_status: str = "CREATED"
    running: bool = False
    booted_at: float | None = None
    polls: int = 0
    gpu_util: float = 0.0
    last_status_change: str = ""
    public_ip: str = "203.0.113.10"
    public_ports: dict = field(default_factory=dict)
    network_volume: dict | None = None  # the network volume mounted at volume_mount_path, as RunPod lists it

    def as_json(self) -> dict:
        runtime = None
        if self.running:
            runtime = {
                "uptimeInSeconds": int(time.time() - (self.booted_at or time.time())),
                "ports": [
                    {"ip": self.public_ip, "isIpPublic": True, "privatePort": private, "publicPort": public,
                     "type": kind}
                    for (private, kind), public in self.public_ports.items()
                ] + [{"ip": "100.65.0.2", "isIpPublic": False, "privatePort": 8888, "publicPort": 60000,
                      "type": "http"}],
                "gpus": [{"id": f"GPU-{self.id}-{i}", "gpuUtilPercent": self.gpu_util} for i in range(self.gpu_count)],
            }
        return {
            "id": self.id,
            "name": self.name,
            "desiredStatus": self.desired_status,
            "lastStatusChange": self.last_status_change,
            "costPerHr": self.cost_per_hr,
            "gpuCount": self.gpu_count,
            "podType": "INTERRUPTABLE" if self.interruptible else "RESERVED",
            "machineId": self.machine_id,
            "imageName": self.image,
            "containerDiskInGb": self.container_disk_gb,
            "dockerArgs": self.docker_args,
            "dockerId": f"{self.id}-docker" if self.running else None,
            "env": [f"{item['key']}={item['value']}" for item in self.env],
            "memoryInGb": 62.0 * self.gpu_count,
            "vcpuCount": 16.0 * self.gpu_count,
            "ports": self.ports,  # the string it was deployed with ("8000/tcp,22/tcp"), null when none was
            "uptimeSeconds": runtime["uptimeInSeconds"] if runtime else 0,
            "volumeInGb": float(self.volume_in_gb),
            "volumeMountPath": self.volume_mount_path,
            "machine": {"gpuDisplayName": self.display_name, "podHostId": f"{self.id}-{self.machine_id}"},
            "runtime": runtime,
            "networkVolumeId": self.network_volume_id,
            "networkVolume": self.network_volume,
            "dataCenterId": self.data_center_id,
        }


class _GraphQLError(Exception):
    pass


class FakeRunPod:
    def __init__(self, api_key: str = RUNPOD_KEY, *, boot_polls: int | None = 2, read_only_keys=()):
        self.api_key = api_key
        self.read_only_keys = set(read_only_keys)  # accepted for queries, refused for mutations
        self.boot_polls = boot_polls  # None: pods boot only on advance()
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self.reset()

    # -- lifecycle of the server -----------------------------------------------------------------------------

    def start(self) -> "FakeRunPod":
        fake = self

        class Handler(_Handler):
            server_state = fake

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        # A short poll interval: shutdown() waits up to one interval, and each test starts its own server.
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server:
            self._server.shutdown()
            self._server.server_close()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_port}/graphql"

    def reset(self) -> None:
        with self._lock:
            self.gpu_types = {row[0]: row for row in CATALOGUE}
            self.pods: dict[str, FakePod] = {}
            self.no_capacity: set = set()
            self.retired = False  # GPU type ids (both clouds) and (id, cloud) pairs
            self.operations: list[str] = []  # every authorised request's operation, in order
            self.deploy_inputs: list[dict] = []  # every deploy's input as sent, for tests of what a rent asks
            self.http_429 = self.http_5xx = self.non_json = self.no_data = 0
            self.retry_after_s: float | None = None
            self.status_5xx = 502
            self.apply_5xx = False
            self.corrupt = None  # a function that mangles every answer's data before it is sent
            self._rng = random.Random(7)
            self._ports = itertools.count(40001)
            self.pub_key = ""
            self.network_volumes: dict[str, dict] = {}
            # pod id -> {"gpu": usd, "disk": usd}; a terminated pod's lines stay, as RunPod's billing history keeps them
            self.billed: dict[str, dict[str, float]] = {}

    # -- controls for tests ----------------------------------------------------------------------------------

    def inject_faults(self, *, http_429: int = 0, retry_after_s: float | None = None, http_5xx: int = 0,
                      status_5xx: int = 502, apply_5xx: bool = False, non_json: int = 0, no_data: int = 0) -> None:
        """The next requests fail: 429s first (with Retry-After when given), then 5xx, then broken bodies.

        apply_5xx: the request is carried out before the 5xx goes back, as when a gateway times out on a pod
        that was in fact deployed.
        """
        with self._lock:
            self.http_429, self.retry_after_s = http_429, retry_after_s
            self.http_5xx, self.status_5xx, self.apply_5xx = http_5xx, status_5xx, apply_5xx
            self.non_json, self.no_data = non_json, no_data

    def retire(self) -> None:
        """From now on every call answers 410 Gone, as RunPod's GraphQL API does once it is switched off."""
        with self._lock:
            self.retired = True

    def corrupt_answers(self, mangle) -> None:
        """From now on every answer's `data` goes through `mangle(data)` after execution: an answer that breaks
        the schema (a proxy's rewrite, a server bug) which no typed execution would produce."""
        with self._lock:
            self.corrupt = mangle

    def capacity_gone(self, gpu_type_id: str, cloud: str | None = None) -> None:
        """Deploys of this GPU type (in one cloud, or in both) fail as RunPod says when it has no machine left; its
        prices are listed as before, its stockStatus goes null."""
        with self._lock:
            self.no_capacity.add(gpu_type_id if cloud is None else (gpu_type_id, cloud))

    def advance(self, pod_id: str | None = None) -> None:
        """Boots one CREATED pod, or all of them."""
        with self._lock:
            for pod in self.pods.values():
                if pod_id in (None, pod.id) and pod.desired_status == "CREATED":
                    self._boot(pod)

    def kill_pod(self, pod_id: str) -> None:
        """The host died and took the pod with it: RunPod no longer knows it."""
        with self._lock:
            del self.pods[pod_id]

    def set_pod(self, pod_id: str, *, desired_status: str | None = None, running: bool | None = None,
                gpu_util: float | None = None, last_status_change: str | None = None) -> None:
        with self._lock:
            pod = self.pods[pod_id]
            if desired_status is not None:
                pod.desired_status = desired_status
            if running is not None:
                pod.running = running
            if gpu_util is not None:
                pod.gpu_util = gpu_util
            if last_status_change is not None:
                pod.last_status_change = last_status_change

    def add_network_volume(self, name: str, size_gb: int, data_center_id: str = "EU-RO-1") -> str:
        """A network volume of the account (made in RunPod's console or API); its id."""
        with self._lock:
            volume_id = "".join(self._rng.choices("abcdefghijklmnopqrstuvwxyz0123456789", k=10))
            self.network_volumes[volume_id] = {"id": volume_id, "name": name, "size": size_gb,
                                               "dataCenterId": data_center_id}
            return volume_id

    def elapse(self, hours: float) -> None:
        """`hours` of billing pass for every pod: GPU time while it runs, its container disk while it runs, its volume
        always (RunPod's published disk rates)."""
        with self._lock:
            for pod in self.pods.values():
                line = self.billed.setdefault(pod.id, {"gpu": 0.0, "disk": 0.0})
                if pod.running:
                    line["gpu"] += pod.cost_per_hr * hours
                disk_rate = DISK_RUNNING_USD_GB_MONTH if pod.running else VOLUME_IDLE_USD_GB_MONTH
                disk_gb = pod.volume_in_gb + (pod.container_disk_gb if pod.running else 0)
                line["disk"] += disk_gb * disk_rate / HOURS_PER_MONTH * hours

    def count(self, operation: str) -> int:
        return self.operations.count(operation)

    # -- the API ---------------------------------------------------------------------------------------------

    def handle(self, key: str | None, body: bytes) -> tuple[int, dict, bytes]:
        """(status, extra headers, body) for one POST /graphql."""
        if key != self.api_key and key not in self.read_only_keys:
            return 401, {}, b"401 Unauthorized"  # RunPod's answer to a wrong key, before any GraphQL
        try:
            request = json.loads(body)
            source, variables = request["query"], request.get("variables") or {}
            document = parse(source)
        except (ValueError, KeyError, TypeError, GraphQLError) as exc:
            message = exc.message if isinstance(exc, GraphQLError) else "Must provide query string."
            return 400, {}, _json({"errors": [{"message": message}]})
        invalid = validate(SCHEMA, document)
        if invalid:
            return 400, {}, _json({"errors": [error.formatted for error in invalid]})
        operations = _operations(document)
        with self._lock:
            self.operations.extend(operations)
            if self.retired:
                return 410, {}, _json({"errors": [{"message": "This API has been retired. Use api.runpod.io/v2."}]})
            if self.http_429:
                self.http_429 -= 1
                headers = {} if self.retry_after_s is None else {"Retry-After": f"{self.retry_after_s:g}"}
                return 429, headers, _json({"errors": [{"message": "Too many requests"}]})
            if self.http_5xx:
                self.http_5xx -= 1
                if self.apply_5xx:
                    self._execute(document, source, variables, key)
                return self.status_5xx, {}, b"<html>upstream error</html>"
            if self.non_json:
                self.non_json -= 1
                return 200, {}, b"<html>Cloudflare: please wait</html>"
            if self.no_data:
                self.no_data -= 1
                return 200, {}, _json({"extensions": {}})
            result = self._execute(document, source, variables, key)
            data = self.corrupt(result.data) if self.corrupt and result.data else result.data
        answer = {"data": data}
        if result.errors:
            answer["errors"] = [error.formatted for error in result.errors]
        return 200, {}, _json(answer)

    def billing_pods(self, key: str | None, query: dict[str, list[str]]) -> tuple[int, dict, bytes]:
        """(status, extra headers, body) for REST API v2's GET /v2/billing/pods: the pods' lines in the bucket that
        holds now, if the window asked for reaches it; a parameter it does not document is refused by name."""
        if key != self.api_key and key not in self.read_only_keys:
            return 401, {}, _problem(401, "Unauthorized", "a valid API key is required")
        unknown = sorted(set(query) - {"startTime", "endTime", "bucketSize", "lastN", "podId"})
        if unknown or any(len(values) != 1 for values in query.values()):
            return 400, {}, _problem(400, "Bad Request", "invalid query",
                                     [f"$: additional properties {name!r} not allowed" for name in unknown])
        one = {name: values[0] for name, values in query.items()}
        bucket = one.get("bucketSize", "day")
        try:
            if bucket not in BUCKETS:
                raise ValueError(f"bucketSize must be one of {', '.join(BUCKETS)}")
            if "lastN" in one and ({"startTime", "endTime"} & set(one) or int(one["lastN"]) < 1):
                raise ValueError("lastN is a whole number from 1, and excludes startTime/endTime")
            now = datetime.now(UTC)
            start = _rfc3339(one["startTime"]) if "startTime" in one else now - timedelta(days=30)
            end = _rfc3339(one["endTime"]) if "endTime" in one else now
        except ValueError as exc:
            return 400, {}, _problem(400, "Bad Request", str(exc))
        bucket_start = _bucket_start(now, bucket)
        bucket_end = _bucket_start(now + _BUCKET_LENGTH[bucket], bucket)
        with self._lock:
            lines = [(pod_id, line) for pod_id, line in self.billed.items()
                     if one.get("podId") in (None, pod_id) and start < bucket_end and end > bucket_start]
        records = [{"startTime": _stamp(bucket_start), "endTime": _stamp(bucket_end), "podId": pod_id,
                    "gpuAmount": round(line["gpu"], 6), "cpuAmount": 0.0, "diskAmount": round(line["disk"], 6),
                    "totalAmount": round(line["gpu"] + line["disk"], 6)} for pod_id, line in lines]
        totals = {name: round(sum(r[name] for r in records), 6)
                  for name in ("totalAmount", "gpuAmount", "cpuAmount", "diskAmount")}
        query_echo = {"startTime": _stamp(start), "endTime": _stamp(end), "bucketSize": bucket,
                      "podId": one.get("podId")}
        return 200, {}, _json({"records": records, "metadata": {
            "query": query_echo, "recordCount": len(records), "uniquePodCount": len(records), "totals": totals}})

    def _execute(self, document, source: str, variables: dict, key: str | None):
        read_only = key in self.read_only_keys
        return graphql_sync(SCHEMA, source, root_value=_Root(self, read_only), variable_values=variables)

    # -- resolvers (called by graphql-core under the lock) ---------------------------------------------------

    def list_gpu_types(self, type_filter: dict | None) -> list[dict]:
        wanted = (type_filter or {}).get("id")
        return [self._gpu_type_node(row) for gpu_id, row in self.gpu_types.items() if wanted in (None, gpu_id)]

    def _gpu_type_node(self, row) -> dict:
        """A GPU type whose `lowestPrice` is worked out for the GPU count its own arguments ask for."""
        node = self.gpu_type_json(row)
        node["lowestPrice"] = lambda info, input=None: self.lowest_price(
            row, int((input or {}).get("gpuCount") or 1), (input or {}).get("secureCloud"))
        return node

    def pod(self, pod_id: str) -> dict | None:
        pod = self.pods.get(pod_id)
        if pod is None:
            return None
        self._poll(pod)
        return pod.as_json()

    def all_pods(self) -> list[dict]:
        for pod in self.pods.values():
            self._poll(pod)
        return [pod.as_json() for pod in self.pods.values()]

    def stop_pod(self, pod_id: str) -> dict:
        pod = self._existing(pod_id)
        pod.desired_status, pod.running, pod.gpu_util = "EXITED", False, 0.0
        pod.last_status_change = "Exited by User: " + time.strftime("%a %b %d %Y %H:%M:%S GMT+0000", time.gmtime())
        return pod.as_json()

    def resume_pod(self, pod_id: str, gpu_count: int) -> dict:
        pod = self._existing(pod_id)
        if gpu_count != pod.gpu_count:
            raise _GraphQLError(f"This pod was created with {pod.gpu_count} GPUs; resume it with {pod.gpu_count}.")
        if not self._in_stock(pod.gpu_type_id, pod.cloud_type):
            raise _GraphQLError("There are not enough free GPUs on the host machine to start this pod.")
        self._boot(pod)
        return pod.as_json()

    def terminate_pod(self, pod_id: str) -> None:
        if self.pods.pop(pod_id, None) is None:
            raise _GraphQLError("Pod not found")

    def _existing(self, pod_id: str) -> FakePod:
        pod = self.pods.get(pod_id)
        if pod is None:
            raise _GraphQLError("Pod not found")
        return pod

    def gpu_type_json(self, row) -> dict:
        gpu_id, name, memory, max_count, secure, community, s_price, c_price, s_spot, c_spot = row
        return {
            "id": gpu_id, "displayName": name, "memoryInGb": memory, "maxGpuCount": max_count,
            "maxGpuCountSecureCloud": max_count if secure else 0,
            "maxGpuCountCommunityCloud": max_count if community else 0, "minPodGpuCount": 1,
            "secureCloud": secure, "communityCloud": community,
            "securePrice": s_price, "communityPrice": c_price,
            "secureSpotPrice": s_spot, "communitySpotPrice": c_spot, "manufacturer": "Nvidia",
            "lowestPrice": self.lowest_price(row, 1, None),
        }

    def lowest_price(self, row, gpu_count: int, secure_cloud: bool | None) -> dict:
        """As RunPod answers it: the cheapest price of the clouds asked for (both without `secureCloud`), which
        stays set when no machine is free; whether one is, is `stockStatus` (null when none is)."""
        gpu_id, _, _, max_count, secure, community, s_price, c_price, s_spot, c_spot = row
        clouds = [(cloud, price, spot) for cloud, listed, price, spot in (
            ("SECURE", secure, s_price, s_spot), ("COMMUNITY", community, c_price, c_spot))
            if listed and secure_cloud in (None, cloud == "SECURE")]
        on_demand = [price for _, price, _ in clouds if price]
        spot = [price for _, _, price in clouds if price]
        stocked = gpu_count <= max_count and any(self._in_stock(gpu_id, cloud) for cloud, _, _ in clouds)
        return {"uninterruptablePrice": min(on_demand) if on_demand else None,
                "minimumBidPrice": min(spot) if spot else None, "stockStatus": "High" if stocked else None}

    def _in_stock(self, gpu_type_id: str, cloud: str) -> bool:
        return not {gpu_type_id, (gpu_type_id, cloud)} & self.no_capacity

    def deploy(self, pod_input: dict, *, interruptible: bool) -> FakePod:
        self.deploy_inputs.append(dict(pod_input))
        for name in ("gpuTypeId", "imageName", "name"):
            if pod_input.get(name) in (None, ""):
                raise _GraphQLError(f"Field {name!r} of the input is required")
        row = self.gpu_types.get(pod_input["gpuTypeId"])
        if row is None:
            raise _GraphQLError(f"Unknown GPU type {pod_input['gpuTypeId']!r}")
        gpu_id, name, _, max_count, secure, community, s_price, c_price, s_spot, c_spot = row
        count = int(pod_input.get("gpuCount") or 1)
        prices = {"SECURE": (secure, s_spot if interruptible else s_price),
                  "COMMUNITY": (community, c_spot if interruptible else c_price)}
        clouds = [pod_input.get("cloudType") or "ALL"]
        if clouds == ["ALL"]:  # either cloud: the cheaper one that has it (Secure only for a network volume)
            clouds = sorted((c for c in prices if prices[c][0] and prices[c][1] and self._in_stock(gpu_id, c)
                             and (c == "SECURE" or pod_input.get("networkVolumeId") is None)),
                            key=lambda c: prices[c][1])
        cloud = clouds[0] if clouds else "SECURE"
        listed, price = prices[cloud]
        if not listed or not price or count > max_count or not self._in_stock(gpu_id, cloud):
            raise _GraphQLError(NO_CAPACITY)
        if interruptible:
            bid = float(pod_input.get("bidPerGpu") or 0)
            if bid < price:
                raise _GraphQLError(f"Your bid of ${bid:.3f}/GPU is below the minimum bid of ${price:.3f}/GPU")
            price = bid
        volume_id, data_center = pod_input.get("networkVolumeId"), pod_input.get("dataCenterId")
        if volume_id is not None:
            volume = self.network_volumes.get(volume_id)
            if volume is None:
                raise _GraphQLError(f"Network volume {volume_id} not found")
            if data_center not in (None, volume["dataCenterId"]):
                raise _GraphQLError(f"Network volume {volume_id} is in {volume['dataCenterId']}, not {data_center}")
            if cloud != "SECURE":
                raise _GraphQLError("Network volumes are available in Secure Cloud only.")
            data_center = volume["dataCenterId"]
        volume_gb = int(pod_input.get("volumeInGb") or 0)
        mount = pod_input.get("volumeMountPath")
        if mount is None and (volume_gb or volume_id):
            mount = "/workspace"  # where RunPod mounts a pod's volume unless told
        pod_id = "".join(self._rng.choices("abcdefghijklmnopqrstuvwxyz0123456789", k=14))
        ports = {}
        for spec in str(pod_input.get("ports") or "").split(","):
            if "/" in spec:
                number, kind = spec.strip().split("/", 1)
                if kind == "tcp":  # RunPod maps TCP ports on the public IP; HTTP ones go through its proxy
                    ports[(int(number), kind)] = next(self._ports)
        pod = FakePod(
            id=pod_id, name=pod_input["name"], gpu_type_id=gpu_id, display_name=name, cloud_type=cloud,
            gpu_count=count, cost_per_hr=round(price * count, 4), interruptible=interruptible,
            image=pod_input["imageName"], env=list(pod_input.get("env") or []), ports=pod_input.get("ports"),
            machine_id=f"m{self._rng.randrange(10**6):06d}", public_ports=ports,
            container_disk_gb=int(pod_input.get("containerDiskInGb") or 10),
            volume_in_gb=volume_gb, volume_mount_path=mount, network_volume_id=volume_id,
            data_center_id=data_center or "EU-RO-1",
            network_volume=dict(self.network_volumes[volume_id]) if volume_id is not None else None,
            docker_args=str(pod_input.get("dockerArgs") or ""),
            last_status_change="Rented by User: " + time.strftime("%a %b %d %Y %H:%M:%S GMT+0000", time.gmtime()),
        )
        self.pods[pod_id] = pod
        self.billed[pod_id] = {"gpu": 0.0, "disk": 0.0}
        if self.boot_polls == 0:
            self._boot(pod)
        return pod

    def _poll(self, pod: FakePod) -> None:
        pod.polls += 1
        if pod.desired_status == "CREATED" and self.boot_polls is not None and pod.polls > self.boot_polls:
            self._boot(pod)

    @staticmethod
    def _boot(pod: FakePod) -> None:
        pod.desired_status, pod.running, pod.booted_at, pod.gpu_util = "RUNNING", True, time.time(), 87.0


class _Root:
    """The root value graphql-core resolves the top-level fields on: each one calls the stand-in."""

    def __init__(self, fake: "FakeRunPod", read_only: bool):
        self.fake, self.read_only = fake, read_only

    def _writable(self) -> None:
        if self.read_only:
            raise _GraphQLError("Unauthorized: this API key is read-only")

    def gpuTypes(self, info, input=None):  # noqa: N802 - the GraphQL field's name
        return self.fake.list_gpu_types(input)

    def myself(self, info):
        return {"id": "user_simulated", "pubKey": self.fake.pub_key,
                "networkVolumes": lambda info: list(self.fake.network_volumes.values()),
                "pods": lambda info: self.fake.all_pods()}

    def updateUserSettings(self, info, input=None):  # noqa: N802 - the GraphQL field's name
        self._writable()
        if input and input.get("pubKey") is not None:
            self.fake.pub_key = input["pubKey"]
        return self.myself(info)

    def pod(self, info, input):
        return self.fake.pod(input["podId"])

    def podFindAndDeployOnDemand(self, info, input=None):  # noqa: N802 - the GraphQL field's name
        self._writable()
        return self.fake.deploy(input or {}, interruptible=False).as_json()

    def podRentInterruptable(self, info, input):  # noqa: N802 - the GraphQL field's name
        self._writable()
        return self.fake.deploy(input, interruptible=True).as_json()

    def podStop(self, info, input):  # noqa: N802 - the GraphQL field's name
        self._writable()
        return self.fake.stop_pod(input["podId"])

    def podResume(self, info, input):  # noqa: N802 - the GraphQL field's name
        self._writable()
        return self.fake.resume_pod(input["podId"], input["gpuCount"])

    def podTerminate(self, info, input):  # noqa: N802 - the GraphQL field's name
        self._writable()
        self.fake.terminate_pod(input["podId"])


def _operations(document) -> list[str]:
    """The top-level fields each operation of the document calls, by name, for tests that count calls."""
    return [selection.name.value for definition in document.definitions
            if isinstance(definition, OperationDefinitionNode)
            for selection in definition.selection_set.selections if hasattr(selection, "name")]


def _json(value) -> bytes:
    return json.dumps(value).encode()


def _problem(status: int, title: str, detail: str, errors=()) -> bytes:
    """REST API v2's error body."""
    return _json({"title": title, "status": status, "detail": detail, **({"errors": list(errors)} if errors else {})})


_BUCKET_LENGTH = {"hour": timedelta(hours=1), "day": timedelta(days=1), "week": timedelta(days=7),
                  "month": timedelta(days=31), "year": timedelta(days=366)}


def _bucket_start(moment: datetime, bucket: str) -> datetime:
    hour = moment.replace(minute=0, second=0, microsecond=0)
    day = hour.replace(hour=0)
    return {"hour": hour, "day": day, "week": day - timedelta(days=day.weekday()), "month": day.replace(day=1),
            "year": day.replace(month=1, day=1)}[bucket]


def _rfc3339(value: str) -> datetime:
    moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    if moment.tzinfo is None:
        raise ValueError(f"{value!r} has no time zone (RFC 3339)")
    return moment.astimezone(UTC)


def _stamp(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class _Handler(BaseHTTPRequestHandler):
    server_state: FakeRunPod

    def do_GET(self):
        path, _, query = self.path.partition("?")
        if path != "/v2/billing/pods":
            self._send(404, {}, _problem(404, "Not Found", f"no route {path}"))
            return
        auth = self.headers.get("Authorization", "")
        key = auth[len("Bearer "):] if auth.startswith("Bearer ") else None
        self._send(*self.server_state.billing_pods(key, parse_qs(query, keep_blank_values=True)))

    def do_POST(self):
        if self.path.split("?", 1)[0] != "/graphql":
            self._send(404, {}, b'{"errors": [{"message": "Not found"}]}')
            return
        auth = self.headers.get("Authorization", "")
        key = auth[len("Bearer "):] if auth.startswith("Bearer ") else None
        length = int(self.headers.get("Content-Length") or 0)
        status, headers, body = self.server_state.handle(key, self.rfile.read(length))
        self._send(status, headers, body)

    def _send(self, status: int, headers: dict, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass
