"""The HTTP face of the market: vast.ai's REST subset under /api/v0, and the simulation's control API under /_sim
(docs/fleet.md, "fleet/simulator/server.py")."""

import hmac
import ipaddress
import json
import logging
import re
import secrets
import threading
from collections import OrderedDict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from .market import Market, MarketError
from .webhooks import NAME, SECRET_HEADER, Receivers

log = logging.getLogger(__name__)

API = "/api/v0"
API_V1 = "/api/v1"
CONTROL = "/_sim"
WEBHOOKS = CONTROL + "/webhooks/"  # a demo receiver: loopback only, no control token (a sender has none)
LOGS = "/logs/"  # where a log request's result_url points; like vast.ai's presigned links it needs no key
KEPT_LOGS = 64

PROXY_PAGES = {
    502: "<html><head><title>502 Bad Gateway</title></head><body><center><h1>502 Bad Gateway</h1></center>"
         "<hr><center>nginx</center></body></html>",
    503: "<html><head><title>503 Service Temporarily Unavailable</title></head><body><center>"
         "<h1>503 Service Temporarily Unavailable</h1></center><hr><center>nginx</center></body></html>",
}


class SimulatorServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address, market: Market, api_key: str, control_token: str | None = None):
        if not api_key:
            raise ValueError("the simulated marketplace needs an API key")
        self.market = market
        self.api_key = api_key
        self.control_token = control_token
        self.logs: OrderedDict[str, str] = OrderedDict()  # result_url token -> log text, the newest KEPT_LOGS
        self.logs_lock = threading.Lock()
        self.receivers = Receivers()
        super().__init__(address, Handler)


MACHINE_STOP = re.compile(r"/instances/(\d+)/?")


def _route(method: str, pattern: str):
    return method, re.compile(pattern + r"/?$")


API_ROUTES = [  # under /api/v0
    (_route("POST", r"/bundles"), "search"),
    (_route("GET", r"/bundles"), "search"),  # the older clients' GET /bundles/?q={json}
    (_route("PUT", r"/search/asks"), "search_asks"),  # the CLI's `search offers --new`: {"q": query}
    (_route("PUT", r"/asks/(\d+)"), "rent"),
    (_route("GET", r"/instances"), "list_instances"),
    (_route("PUT", r"/instances"), "manage_instances"),  # several: {"ids": [...], "state": ...}
    (_route("DELETE", r"/instances"), "destroy_instances"),  # several: {"instance_ids": [...]}
    (_route("GET", r"/instances/filters"), "instance_filters"),
    (_route("PUT", r"/instances/request_logs/(\d+)"), "request_logs"),
    (_route("PUT", r"/instances/bid_price/(\d+)"), "change_bid"),
    (_route("PUT", r"/instances/reboot/(\d+)"), "reboot"),
    (_route("POST", r"/instances/(\d+)/ssh"), "attach_ssh"),
    (_route("DELETE", r"/instances/(\d+)/ssh/(\d+)"), "detach_ssh"),
    (_route("GET", r"/ssh"), "show_ssh_keys"),
    (_route("POST", r"/ssh"), "create_ssh_key"),
    (_route("PUT", r"/ssh/(\d+)"), "update_ssh_key"),
    (_route("DELETE", r"/ssh/(\d+)"), "delete_ssh_key"),
    (_route("GET", r"/instances/(\d+)"), "show_instance"),
    (_route("PUT", r"/instances/(\d+)"), "manage_instance"),
    (_route("DELETE", r"/instances/(\d+)"), "destroy_instance"),
    (_route("GET", r"/charges"), "charges"),
    (_route("POST", r"/volumes/search"), "search_volumes"),
    (_route("GET", r"/volumes"), "list_volumes"),
    (_route("PUT", r"/volumes"), "create_volume"),
    (_route("DELETE", r"/volumes"), "delete_volume"),
    (_route("GET", r"/users/current"), "show_user"),
    (_route("GET", r"/users/me/invoices"), "invoices"),
]

API_V1_ROUTES = [  # under /api/v1, where the current CLI lists instances and invoices
    (_route("GET", r"/instances"), "instances_page"),
    (_route("GET", r"/invoices"), "invoices_report"),
]

# What the official CLI and SDK call that the simulation does not model, by the command a user typed: answered 501
# with a JSON error that names it, as is any other path under the API.
NOT_MODELLED = [
    (re.compile(r"/instances/recycle/\d+/?$"), "recycle instance"),
    (re.compile(r"/instances/prepay/\d+/?$"), "prepay instance"),
    (re.compile(r"/instances/\d+/(?:cancel_)?(?:copy|sync)/?"), "copy / cancel copy"),
    (re.compile(r"/commands/"), "copy, cloud copy or execute"),
    (re.compile(r"/instances/execute/"), "execute"),
    (re.compile(r"/instances/\d+/snapshot/?"), "take snapshot"),
    (re.compile(r"/network_volumes?(?:/|$)"), "network volumes"),
    (re.compile(r"/volumes?/(?:copy|unlist)"), "clone volume / unlist volume"),
    (re.compile(r"/template"), "templates"),
    (re.compile(r"/(?:endptjobs|workergroups|autojobs|endpoints?)/"), "serverless endpoints and workergroups"),
    (re.compile(r"/machines?/"), "host machines"),
    (re.compile(r"/(?:secrets|env_vars?)/"), "environment variables"),
    (re.compile(r"/(?:auth/apikeys|apikeys?)/"), "API keys"),
    (re.compile(r"/(?:team|teams|subaccounts?)/"), "teams and subaccounts"),
    (re.compile(r"/scheduled_jobs/"), "scheduled jobs"),
    (re.compile(r"/(?:benchmarks|metrics)/"), "benchmarks and metrics"),
    (re.compile(r"/(?:price_increases?|instances/price_increase)/"), "price increases"),
    (re.compile(r"/(?:clusters?|overlays?)/"), "clusters and overlays"),
]

CONTROL_ROUTES = [
    (_route("GET", r"/state"), "sim_state"),
    (_route("GET", r"/offers"), "sim_offers"),
    (_route("POST", r"/reset"), "sim_reset"),
    (_route("POST", r"/advance"), "sim_advance"),
    (_route("POST", r"/traffic"), "sim_traffic"),
    (_route("POST", r"/faults"), "sim_faults"),
    (_route("POST", r"/instances/(\d+)/kill"), "sim_kill"),
    (_route("POST", r"/instances/(\d+)/hang"), "sim_hang"),
    (_route("POST", r"/instances/(\d+)/reclaim"), "sim_reclaim"),
    (_route("POST", r"/instances/(\d+)/uplink"), "sim_uplink"),
]


class Handler(BaseHTTPRequestHandler):
    server: SimulatorServer
    protocol_version = "HTTP/1.1"  # keep-alive, so a client's connection pool is exercised like against vast.ai
    server_version = "vast-sim/1"

    def do_GET(self):
        self._handle("GET")

    def do_POST(self):
        self._handle("POST")

    def do_PUT(self):
        self._handle("PUT")

    def do_DELETE(self):
        self._handle("DELETE")

    def log_message(self, format, *args):
        log.debug("%s - %s", self.address_string(), format % args)

    # --- dispatch ---

    def _handle(self, method: str) -> None:
        url = urlsplit(self.path)
        self.query = {name: values[-1] for name, values in parse_qs(url.query).items()}
        raw = self.raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))  # read it always: keep-alive
        try:
            self.body = json.loads(raw) if raw.strip() else {}
        except ValueError:
            self.body = None
        try:
            if url.path.startswith(API + "/") or url.path == API:
                self._api(method, url.path[len(API):], API_ROUTES)
            elif url.path.startswith(API_V1 + "/"):
                self._api(method, url.path[len(API_V1):], API_V1_ROUTES)
            elif url.path.startswith(LOGS) and method == "GET":
                self._log_result(url.path[len(LOGS):])
            elif url.path.startswith(WEBHOOKS):
                self._webhooks(method, url.path[len(WEBHOOKS):].rstrip("/"))
            elif url.path.startswith(CONTROL + "/"):
                self._control(method, url.path[len(CONTROL):])
            else:
                self._error(404, "not_found", f"No route for {url.path}")
        except MarketError as exc:
            self._error(exc.status, exc.error, exc.msg)
        except Exception:
            log.exception("simulator failed on %s %s", method, self.path)
            self._error(500, "server_error", "Internal server error")

    def _api(self, method: str, path: str, routes) -> None:
        failure = self.server.market.take_request_fault(path)
        if failure is not None:
            self._injected(failure)
            return
        if not self._authorised() and not self._machines_own_stop(method, path, routes):
            self._error(401, "invalid_user_key", "Invalid user key: check the Authorization: Bearer header")
            return
        self._dispatch(routes, method, path)

    def _control(self, method: str, path: str) -> None:
        token = self.server.control_token
        if not ipaddress.ip_address(self.client_address[0]).is_loopback:
            self._error(403, "forbidden", "The control API answers only loopback clients")
            return
        if token and not hmac.compare_digest(self.headers.get("X-Sim-Token", ""), token):
            self._error(403, "forbidden", "Wrong or missing X-Sim-Token")
            return
        self._dispatch(CONTROL_ROUTES, method, path)

    def _webhooks(self, method: str, name: str) -> None:
        if not ipaddress.ip_address(self.client_address[0]).is_loopback:
            self._error(403, "forbidden", "The demo webhook receiver answers only loopback clients")
        elif not NAME.fullmatch(name):
            self._error(404, "not_found", "A receiver's name is 1-40 letters, digits, '-' or '_'")
        elif method == "POST":
            self.server.receivers.receive(name, {k.lower(): v for k, v in self.headers.items()}, self.raw)
            self._json(200, {"success": True})
        elif method == "GET":
            self._json(200, self.server.receivers.listing(name, self.headers.get(SECRET_HEADER, "").strip()))
        else:
            self._error(405, "method_not_allowed", f"{method} is not allowed on a webhook receiver")

    def _dispatch(self, routes, method: str, path: str) -> None:
        path_matched = False
        for (route_method, pattern), name in routes:
            found = pattern.match(path)
            if found:
                path_matched = True
                if route_method == method:
                    if not isinstance(self.body, dict):
                        self._error(400, "invalid_args", "The body is not a JSON object")
                        return
                    getattr(self, name)(*(int(g) for g in found.groups()))
                    return
        if path_matched:
            self._error(405, "method_not_allowed", f"{method} is not allowed on {path}")
        elif routes is CONTROL_ROUTES:
            self._error(404, "not_found", f"No route for {path}")
        else:
            command = next((name for pattern, name in NOT_MODELLED if pattern.match(path)), None)
            what = f"`{command}` ({method} {path})" if command else f"{method} {path}"
            self._error(501, "not_supported", f"{what} is not supported by the simulated marketplace; see "
                        "fleet/simulator/README.md for what it models")

    def _key(self) -> str:
        header = self.headers.get("Authorization", "")
        key = header[len("Bearer "):].strip() if header.startswith("Bearer ") else ""
        return key or self.query.get("api_key", "")  # vast.ai also takes ?api_key=

    def _authorised(self) -> bool:
        key = self._key()
        return bool(key) and hmac.compare_digest(key.encode(), self.server.api_key.encode())

    def _machines_own_stop(self, method: str, path: str, routes) -> bool:
        """A machine's own key (CONTAINER_API_KEY) opens one call: its own instance's state change (a stop)."""
        found = MACHINE_STOP.fullmatch(path)
        key = self._key()
        if routes is not API_ROUTES or method != "PUT" or found is None or not key:
            return False
        return (isinstance(self.body, dict) and set(self.body) == {"state"}
                and self.server.market.container_instance(key) == int(found.group(1)))

    # --- vast.ai API ---

    def search(self) -> None:
        retry_after = self.server.market.search_retry_after(self.client_address[0])
        if retry_after is not None:
            self._too_many(retry_after, "API requests too frequent: searches are rate limited")
            return
        body = self.body
        if "q" in self.query:
            try:
                body = json.loads(self.query["q"])
            except ValueError:
                self._error(400, "invalid_args", "q is not valid JSON")
                return
        self._json(200, {"offers": self.server.market.search(body)})

    def search_asks(self) -> None:
        query = self.body.get("q")
        if not isinstance(query, dict):
            self._error(400, "invalid_args", "q must be the search query as a JSON object")
            return
        self.body = query
        self.search()

    def rent(self, offer_id: int) -> None:
        instance_id = self.server.market.rent(offer_id, self.body)
        self._json(200, {"success": True, "new_contract": instance_id})

    def list_instances(self) -> None:
        # vast.ai retired the v0 list in 2026 (clients that still call it must learn so, not get a stale answer).
        self._error(410, "deprecated_endpoint", "/api/v0/instances/ is deprecated. Use /api/v1/instances/ instead.")

    def show_instance(self, instance_id: int) -> None:
        # vast.ai answers an id it does not know (or no longer lists) with {"instances": null}, and the official
        # CLI prints "not found" for exactly that; a 404 would be an error it does not expect.
        try:
            record = self.server.market.get_instance(instance_id)
        except MarketError as exc:
            if exc.error != "no_such_instance":
                raise
            record = None
        self._json(200, {"instances": record})

    def instances_page(self) -> None:
        self._json(200, self.server.market.instances_page(self.query))

    def instance_filters(self) -> None:
        self._json(200, {"success": True, "filters": self.server.market.instance_filters()})

    def manage_instances(self) -> None:
        ids = self._id_list("ids")
        if ids is not None:
            changes = {k: v for k, v in self.body.items() if k != "ids"}
            results = self._each(ids, lambda instance_id: self.server.market.manage(instance_id, changes))
            self._json(200, {"success": True, "results": results})

    def destroy_instances(self) -> None:
        ids = self._id_list("instance_ids")
        if ids is not None:
            self._json(200, {"success": True, "results": self._each(ids, self.server.market.destroy)})

    def request_logs(self, instance_id: int) -> None:
        text = self.server.market.instance_logs(instance_id, self.body)
        token = secrets.token_urlsafe(16)
        with self.server.logs_lock:
            self.server.logs[token] = text
            while len(self.server.logs) > KEPT_LOGS:
                self.server.logs.popitem(last=False)
        host = self.headers.get("Host") or "{}:{}".format(*self.server.server_address[:2])
        self._json(200, {"success": True, "result_url": f"http://{host}{LOGS}{token}"})

    def _log_result(self, token: str) -> None:
        with self.server.logs_lock:
            text = self.server.logs.get(token)
        if text is None:
            self._error(404, "not_found", "No such log result (they are kept for the newest requests only)")
            return
        self._send(200, text.encode(), "text/plain; charset=utf-8", {})

    def change_bid(self, instance_id: int) -> None:
        msg = self.server.market.change_bid(instance_id, self.body)
        self._json(200, {"success": True, "msg": msg})

    def reboot(self, instance_id: int) -> None:
        self.server.market.reboot(instance_id)
        self._json(200, {"success": True, "msg": f"Rebooting instance {instance_id}"})

    def show_ssh_keys(self) -> None:
        self._json(200, self.server.market.ssh_keys("listing"))  # a bare list, as vast.ai documents it

    def create_ssh_key(self) -> None:
        self._json(200, {"success": True, "key": self.server.market.ssh_keys("add", self.body.get("ssh_key"))})

    def update_ssh_key(self, key_id: int) -> None:
        self.server.market.ssh_keys("update", key_id, self.body.get("ssh_key"))
        self._json(200, {"success": True})

    def delete_ssh_key(self, key_id: int) -> None:
        self.server.market.ssh_keys("delete", key_id)
        self._json(200, {"success": True})

    def attach_ssh(self, instance_id: int) -> None:
        key_id = self.server.market.ssh_keys("attach", instance_id, self.body.get("ssh_key"))
        self._json(200, {"success": True, "msg": f"ssh key {key_id} attached to instance {instance_id}"})

    def detach_ssh(self, instance_id: int, key_id: int) -> None:
        self.server.market.ssh_keys("detach", instance_id, key_id)
        self._json(200, {"success": True, "msg": f"ssh key {key_id} detached from instance {instance_id}"})

    def search_volumes(self) -> None:
        self._json(200, {"offers": self.server.market.search_volumes(self.body)})

    def list_volumes(self) -> None:
        self._json(200, {"volumes": self.server.market.list_volumes()})

    def create_volume(self) -> None:
        self._json(200, {"success": True, "volume_name": self.server.market.create_volume(self.body)})

    def delete_volume(self) -> None:
        volume_id = str(self.query.get("id") or self.body.get("id") or "")
        if not volume_id.isdigit():
            self._error(400, "invalid_args", "id must be the volume's id")
            return
        self.server.market.delete_volume(int(volume_id))
        self._json(200, {"success": True, "msg": f"Volume {volume_id} deleted"})

    def show_user(self) -> None:
        self._json(200, self.server.market.user())

    def invoices(self) -> None:
        self._json(200, self.server.market.invoices(self.query))

    def invoices_report(self) -> None:
        self._json(200, self.server.market.invoices_report(self.query))

    def manage_instance(self, instance_id: int) -> None:
        self.server.market.manage(instance_id, self.body)
        self._json(200, {"success": True})

    def destroy_instance(self, instance_id: int) -> None:
        self.server.market.destroy(instance_id)
        self._json(200, {"success": True})

    def charges(self) -> None:
        retry_after = self.server.market.charges_retry_after(self.client_address[0])
        if retry_after is not None:
            self._too_many(retry_after, "API requests too frequent: charges polled too fast")
            return
        # vast.ai's charge report needs its day range, as select_filters {"day": {"gte": t0, "lte": t1}}.
        try:
            day = json.loads(self.query.get("select_filters") or "{}").get("day")
        except (ValueError, AttributeError):
            day = None
        if not (isinstance(day, dict) and "gte" in day and "lte" in day):
            self._error(400, "invalid_args", "Must provide both 'day' gte and lte filters")
            return
        self._json(200, self.server.market.charges_report(self.query))

    # --- control API ---

    def sim_state(self) -> None:
        self._json(200, self.server.market.state())

    def sim_offers(self) -> None:
        self._json(200, {"offers": self.server.market.offers()})

    def sim_reset(self) -> None:
        self.server.market.reset()
        self._json(200, {"success": True})

    def sim_advance(self) -> None:
        self._json(200, {"success": True, "clock": self.server.market.advance(self.body.get("seconds"))})

    def sim_traffic(self) -> None:
        body = self.body
        self.server.market.report_traffic(
            _int_field(body, "instance_id"), body.get("upload_gb", 0.0), body.get("download_gb", 0.0)
        )
        self._json(200, {"success": True})

    def sim_faults(self) -> None:
        allowed = {"http_429", "retry_after_s", "retry_after", "http_5xx", "status_5xx", "path_contains",
                   "offers_gone", "fail_next_rents", "driver_too_old_offers"}
        unknown = set(self.body) - allowed
        if unknown:
            raise MarketError(400, "invalid_args", f"unknown fault(s) {sorted(unknown)}; known: {sorted(allowed)}")
        self._json(200, {"success": True, "faults": self.server.market.inject_faults(**self.body)})

    def sim_kill(self, instance_id: int) -> None:
        self.server.market.kill_host(instance_id, self.body.get("vanish_after_s"))
        self._json(200, {"success": True})

    def sim_hang(self, instance_id: int) -> None:
        self.server.market.hang_host(instance_id)
        self._json(200, {"success": True})

    def sim_reclaim(self, instance_id: int) -> None:
        self.server.market.reclaim(instance_id)
        self._json(200, {"success": True})

    def sim_uplink(self, instance_id: int) -> None:
        mbps = self.body.get("mbps")
        if not isinstance(mbps, (int, float)) or mbps <= 0:
            raise MarketError(400, "invalid_args", "mbps must be a number > 0")
        self.server.market.set_uplink(instance_id, mbps)
        self._json(200, {"success": True})

    def _id_list(self, name: str) -> list[int] | None:
        ids = self.body.get(name)
        if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            self._error(400, "invalid_args", f"{name} must be a list of instance ids")
            return None
        return ids

    @staticmethod
    def _each(ids: list[int], action) -> list[dict]:
        results: list[dict] = []
        for instance_id in ids:
            try:
                action(instance_id)
                results.append({"id": instance_id, "success": True})
            except MarketError as exc:
                results.append({"id": instance_id, "success": False, "error": exc.error, "msg": exc.msg})
        return results

    # --- responses ---

    def _injected(self, failure) -> None:
        header = {"Retry-After": failure.retry_after} if failure.retry_after else {}
        if failure.status == 429:
            self._too_many(failure.retry_after_s or 1, "API requests too frequent", header)
        elif failure.status in PROXY_PAGES:
            self._send(failure.status, PROXY_PAGES[failure.status].encode(), "text/html",
                       header or ({"Retry-After": str(failure.retry_after_s)} if failure.retry_after_s else {}))
        else:
            self._json(failure.status, {"success": False, "error": "server_error", "msg": "Internal server error"},
                       header)

    def _too_many(self, retry_after_s: int, msg: str, header: dict | None = None) -> None:
        self._json(429, {"success": False, "error": "rate_limited", "msg": f"{msg}; retry after {retry_after_s} s"},
                   header or {"Retry-After": str(retry_after_s)})

    def _error(self, status: int, error: str, msg: str) -> None:
        self._json(status, {"success": False, "error": error, "msg": msg})

    def _json(self, status: int, payload, headers: dict | None = None) -> None:
        self._send(status, json.dumps(payload).encode(), "application/json", headers or {})

    def _send(self, status: int, body: bytes, content_type: str, headers: dict) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)


def _int_field(body: dict, name: str) -> int:
    value = body.get(name)
    if not isinstance(value, int) or isinstance(value, bool):
        raise MarketError(400, "invalid_args", f"{name} must be an integer")
    return value
