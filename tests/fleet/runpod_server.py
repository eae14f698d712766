"""A fake RunPod GraphQL API for tests: a real HTTP server on a free loopback port, in a thread of the test process.

It answers the operations the product's RunPod client sends (gpuTypes, podFindAndDeployOnDemand,
podRentInterruptable, podTerminate, myself { pods }, pod), recognising each by its field name and reading its
`variables`; it is not a GraphQL parser and answers every field it knows whatever the selection set asks for.
Like RunPod it answers a wrong key with HTTP 401, and a refused operation with HTTP 200 and an `errors` list.

Pods live in memory: a new pod is CREATED without a runtime; after `boot_polls` reads of it (or `advance()`) it is
RUNNING with a runtime (public ports, GPU utilisation). Terminate removes it, as RunPod stops listing terminated pods.

Faults for the next requests: `inject_faults(http_429=, retry_after_s=, http_5xx=, status_5xx=, apply_5xx=,
non_json=, no_data=)`; lasting ones: `capacity_gone(gpu_type_id)`, `kill_pod(pod_id)` (host died: the pod is gone),
`set_pod(pod_id, ...)` (the host side changes a pod's state).
"""

import itertools
import json
import random
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

RUNPOD_KEY = "test-runpod-key"
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
    ports: str
    machine_id: str
    docker_args: str = ""
    desired_status: str = "CREATED"
    running: bool = False
    booted_at: float | None = None
    polls: int = 0
    gpu_util: float = 0.0
    last_status_change: str = ""
    public_ip: str = "203.0.113.10"
    public_ports: dict = field(default_factory=dict)

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
            "machine": {"gpuDisplayName": self.display_name},
            "runtime": runtime,
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
            self.no_capacity: set[str] = set()
            self.operations: list[str] = []  # every authorised request's operation, in order
            self.http_429 = self.http_5xx = self.non_json = self.no_data = 0
            self.retry_after_s: float | None = None
            self.status_5xx = 502
            self.apply_5xx = False
            self._rng = random.Random(7)
            self._ports = itertools.count(40001)

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

    def capacity_gone(self, gpu_type_id: str) -> None:
        """Deploys of this GPU type fail as RunPod says when it has no machine left; the listing is unchanged."""
        with self._lock:
            self.no_capacity.add(gpu_type_id)

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

    def count(self, operation: str) -> int:
        return self.operations.count(operation)

    # -- the API ---------------------------------------------------------------------------------------------

    def handle(self, key: str | None, body: bytes) -> tuple[int, dict, bytes]:
        """(status, extra headers, body) for one POST /graphql."""
        if key != self.api_key and key not in self.read_only_keys:
            return 401, {}, b"401 Unauthorized"  # RunPod's answer to a wrong key, before any GraphQL
        try:
            request = json.loads(body)
            query, variables = request["query"], request.get("variables") or {}
            operation = _operation(query)
        except (ValueError, KeyError, TypeError):
            return 400, {}, _json({"errors": [{"message": "Must provide query string."}]})
        with self._lock:
            self.operations.append(operation)
            if self.http_429:
                self.http_429 -= 1
                headers = {} if self.retry_after_s is None else {"Retry-After": f"{self.retry_after_s:g}"}
                return 429, headers, _json({"errors": [{"message": "Too many requests"}]})
            if self.http_5xx:
                self.http_5xx -= 1
                if self.apply_5xx:
                    try:
                        self._answer(operation, variables, read_only=key in self.read_only_keys)
                    except _GraphQLError:
                        pass
                return self.status_5xx, {}, b"<html>upstream error</html>"
            if self.non_json:
                self.non_json -= 1
                return 200, {}, b"<html>Cloudflare: please wait</html>"
            if self.no_data:
                self.no_data -= 1
                return 200, {}, _json({"extensions": {}})
            try:
                data = self._answer(operation, variables, read_only=key in self.read_only_keys)
            except _GraphQLError as exc:
                return 200, {}, _json({"errors": [{"message": str(exc), "path": [operation]}],
                                       "data": {operation: None}})
        return 200, {}, _json({"data": data})

    def _answer(self, operation: str, variables: dict, *, read_only: bool) -> dict:
        if operation in ("podFindAndDeployOnDemand", "podRentInterruptable", "podTerminate") and read_only:
            raise _GraphQLError("Unauthorized: this API key is read-only")
        if operation == "gpuTypes":
            return {"gpuTypes": [self._gpu_type(row, int(variables.get("gpuCount", 1))) for row in
                                 self.gpu_types.values()]}
        if operation == "myself":
            pods = list(self.pods.values())
            for pod in pods:
                self._poll(pod)
            return {"myself": {"pods": [pod.as_json() for pod in pods]}}
        if operation == "pod":
            pod = self.pods.get(variables.get("podId"))
            if pod is None:
                return {"pod": None}
            self._poll(pod)
            return {"pod": pod.as_json()}
        if operation in ("podFindAndDeployOnDemand", "podRentInterruptable"):
            pod = self._deploy(variables.get("input") or {}, interruptible=operation == "podRentInterruptable")
            return {operation: {"id": pod.id, "machineId": pod.machine_id}}
        if operation == "podTerminate":
            if self.pods.pop(variables.get("podId"), None) is None:
                raise _GraphQLError("Pod not found")
            return {"podTerminate": None}
        raise _GraphQLError(f"Cannot query field {operation!r} on this fake")

    def _gpu_type(self, row, gpu_count: int) -> dict:
        gpu_id, name, memory, max_count, secure, community, s_price, c_price, s_spot, c_spot = row
        available = gpu_count <= max_count and (secure or community) and gpu_id not in self.no_capacity
        on_demand = [p for p, ok in ((s_price, secure), (c_price, community)) if ok and p]
        spot = [p for p, ok in ((s_spot, secure), (c_spot, community)) if ok and p]
        return {
            "id": gpu_id, "displayName": name, "memoryInGb": memory, "maxGpuCount": max_count,
            "secureCloud": secure, "communityCloud": community,
            "securePrice": s_price, "communityPrice": c_price,
            "secureSpotPrice": s_spot, "communitySpotPrice": c_spot,
            "lowestPrice": {
                "uninterruptablePrice": min(on_demand) if available and on_demand else None,
                "minimumBidPrice": min(spot) if available and spot else None,
            },
        }

    def _deploy(self, pod_input: dict, *, interruptible: bool) -> FakePod:
        for name in ("gpuTypeId", "cloudType", "gpuCount", "imageName", "name"):
            if pod_input.get(name) in (None, ""):
                raise _GraphQLError(f"Field {name!r} of the input is required")
        row = self.gpu_types.get(pod_input["gpuTypeId"])
        if row is None:
            raise _GraphQLError(f"Unknown GPU type {pod_input['gpuTypeId']!r}")
        gpu_id, name, _, max_count, secure, community, s_price, c_price, s_spot, c_spot = row
        cloud, count = pod_input["cloudType"], int(pod_input["gpuCount"])
        listed = {"SECURE": secure, "COMMUNITY": community}.get(cloud)
        if interruptible:
            price = s_spot if cloud == "SECURE" else c_spot
        else:
            price = s_price if cloud == "SECURE" else c_price
        if not listed or not price or count > max_count or gpu_id in self.no_capacity:
            raise _GraphQLError(NO_CAPACITY)
        if interruptible:
            bid = float(pod_input.get("bidPerGpu") or 0)
            if bid < price:
                raise _GraphQLError(f"Your bid of ${bid:.3f}/GPU is below the minimum bid of ${price:.3f}/GPU")
            price = bid
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
            image=pod_input["imageName"], env=list(pod_input.get("env") or []), ports=str(pod_input.get("ports")),
            machine_id=f"m{self._rng.randrange(10**6):06d}", public_ports=ports,
            docker_args=str(pod_input.get("dockerArgs") or ""),
            last_status_change="Rented by User: " + time.strftime("%a %b %d %Y %H:%M:%S GMT+0000", time.gmtime()),
        )
        self.pods[pod_id] = pod
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


_OPERATIONS = ("podFindAndDeployOnDemand", "podRentInterruptable", "podTerminate", "gpuTypes", "myself")


def _operation(query: str) -> str:
    """The top-level field the document calls, by name: enough for the client's fixed documents."""
    for name in _OPERATIONS:
        if re.search(rf"\b{name}\b", query):
            return name
    if re.search(r"\bpod\s*\(", query):
        return "pod"
    raise ValueError("no known operation")


def _json(value) -> bytes:
    return json.dumps(value).encode()


class _Handler(BaseHTTPRequestHandler):
    server_state: FakeRunPod

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
