"""The HTTP face of the market: vast.ai's REST subset under /api/v0, and the simulation's control API under /_sim.

Order of checks for /api/v0, as vast.ai's front does it: injected faults (a proxy's 429/5xx), then the API key,
then the rate limits, then the request itself. Errors come back as `{"success": false, "error", "msg"}`, except
injected 502/503, which come back as the HTML page a proxy sends.
The control API needs no vast.ai key; it answers only clients on a loopback address, and when the marketplace has a
control token, only requests whose `X-Sim-Token` header carries it.
"""

import hmac
import ipaddress
import json
import logging
import re
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from .market import Market, MarketError

log = logging.getLogger(__name__)

API = "/api/v0"
CONTROL = "/_sim"

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
        super().__init__(address, Handler)


def _route(method: str, pattern: str):
    return method, re.compile(pattern + r"/?$")


API_ROUTES = [
    (_route("POST", r"/bundles"), "search"),
    (_route("GET", r"/bundles"), "search"),  # the older clients' GET /bundles/?q={json}
    (_route("PUT", r"/asks/(\d+)"), "rent"),
    (_route("GET", r"/instances"), "list_instances"),
    (_route("GET", r"/instances/(\d+)"), "show_instance"),
    (_route("PUT", r"/instances/(\d+)"), "manage_instance"),
    (_route("DELETE", r"/instances/(\d+)"), "destroy_instance"),
    (_route("GET", r"/charges"), "charges"),
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
        self.query = parse_qs(url.query)
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))  # read it always: keep-alive
        try:
            self.body = json.loads(raw) if raw.strip() else {}
        except ValueError:
            self.body = None
        try:
            if url.path.startswith(API + "/") or url.path == API:
                self._api(method, url.path[len(API):])
            elif url.path.startswith(CONTROL + "/"):
                self._control(method, url.path[len(CONTROL):])
            else:
                self._error(404, "not_found", f"No route for {url.path}")
        except MarketError as exc:
            self._error(exc.status, exc.error, exc.msg)
        except Exception:
            log.exception("simulator failed on %s %s", method, self.path)
            self._error(500, "server_error", "Internal server error")

    def _api(self, method: str, path: str) -> None:
        failure = self.server.market.take_request_fault(path)
        if failure is not None:
            self._injected(failure)
            return
        if not self._authorised():
            self._error(401, "invalid_user_key", "Invalid user key: check the Authorization: Bearer header")
            return
        self._dispatch(API_ROUTES, method, path)

    def _control(self, method: str, path: str) -> None:
        token = self.server.control_token
        if not ipaddress.ip_address(self.client_address[0]).is_loopback:
            self._error(403, "forbidden", "The control API answers only loopback clients")
            return
        if token and not hmac.compare_digest(self.headers.get("X-Sim-Token", ""), token):
            self._error(403, "forbidden", "Wrong or missing X-Sim-Token")
            return
        self._dispatch(CONTROL_ROUTES, method, path)

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
        else:
            self._error(404, "not_found", f"No route for {path}")

    def _authorised(self) -> bool:
        header = self.headers.get("Authorization", "")
        key = header[len("Bearer "):].strip() if header.startswith("Bearer ") else ""
        key = key or self.query.get("api_key", [""])[0]  # vast.ai also takes ?api_key=
        return bool(key) and hmac.compare_digest(key.encode(), self.server.api_key.encode())

    # --- vast.ai API ---

    def search(self) -> None:
        retry_after = self.server.market.search_retry_after(self.client_address[0])
        if retry_after is not None:
            self._too_many(retry_after, "API requests too frequent: searches are rate limited")
            return
        body = self.body
        if "q" in self.query:
            try:
                body = json.loads(self.query["q"][0])
            except ValueError:
                self._error(400, "invalid_args", "q is not valid JSON")
                return
        self._json(200, {"offers": self.server.market.search(body)})

    def rent(self, offer_id: int) -> None:
        instance_id = self.server.market.rent(offer_id, self.body)
        self._json(200, {"success": True, "new_contract": instance_id})

    def list_instances(self) -> None:
        self._json(200, {"instances": self.server.market.list_instances()})

    def show_instance(self, instance_id: int) -> None:
        self._json(200, {"instances": self.server.market.get_instance(instance_id)})

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
        self._json(200, {"charges": self.server.market.charges()})

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
        allowed = {"http_429", "retry_after_s", "http_5xx", "status_5xx", "path_contains", "offers_gone",
                   "fail_next_rents", "driver_too_old_offers"}
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

    # --- responses ---

    def _injected(self, failure) -> None:
        if failure.status == 429:
            self._too_many(failure.retry_after_s or 1, "API requests too frequent")
        elif failure.status in PROXY_PAGES:
            self._send(failure.status, PROXY_PAGES[failure.status].encode(), "text/html",
                       {"Retry-After": str(failure.retry_after_s)} if failure.retry_after_s else {})
        else:
            self._error(failure.status, "server_error", "Internal server error")

    def _too_many(self, retry_after_s: int, msg: str) -> None:
        self._json(429, {"success": False, "error": "rate_limited", "msg": f"{msg}; retry after {retry_after_s} s"},
                   {"Retry-After": str(retry_after_s)})

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
