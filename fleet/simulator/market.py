"""The simulated marketplace's state and rules, pure of HTTP, under one lock; every call first brings the state up to
the clock's "now"."""

import hmac
import json
import logging
import random
import secrets
import socket
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import pairwise

from . import account, billing, saved, volumes
from .keys import SshKeyError, SshKeys
from .catalogue import Offer, build_catalogue
from .clock import SimClock
from .faults import Failure, RequestFaults
from .hooks import InstanceHooks
from .instances import CUDA_803, Instance, image_cuda_version
from .limits import MinInterval, SlidingWindowLimit
from .pages import json_arg, paginate
from .search import QueryError, check_fields, matching, ordered, parse_filters, parse_query, select
from .volumes import Volume

log = logging.getLogger(__name__)

DEFAULT_DISK_GB = 10.0


class MarketError(Exception):
    """A refusal the API answers with `{"success": false, "error": ..., "msg": ...}`."""

    def __init__(self, status: int, error: str, msg: str):
        super().__init__(msg)
        self.status = status
        self.error = error
        self.msg = msg


@dataclass(frozen=True)
class Settings:
    seed: int = 7
    speed: float = 1.0  # simulated seconds per real second; 0 freezes the clock between advance() calls
    boot_delay_s: float = 90.0  # simulated seconds from rent to "running"
    offer_count: int = 300
    search_limit_per_min: int = 600  # vast.ai allows about 10
    charges_min_interval_s: float = 1.0  # real seconds between two answered GET /charges/
    dead_listed_s: float = 600.0  # simulated seconds a dead host's instance stays listed as "exited"
    starting_credit_usd: float = 1000.0  # the account's one deposit
    # The boxes run as processes on this machine (fleet/simulator/agents.py): each shows 127.0.0.1 as its public
    # address and maps its ports other than ssh to free local ports, so a probe reaches what the box serves.
    loopback_boxes: bool = False
    # Where the state is kept (fleet/simulator/saved.py), so that a marketplace started again lists the same
    # instances and never hands out an id twice, as a real provider's restarted API does.
    state_file: str = ""


class Market:
    def __init__(self, settings: Settings | None = None, hooks: InstanceHooks | None = None):
        self.settings = settings or Settings()
        self.hooks = hooks or InstanceHooks()
        self._lock = threading.Lock()
        self._hook_lock = threading.RLock()  # keeps hook calls in event order across threads
        self._events: list[tuple[str, dict]] = []
        self._saved_key = ""
        self._clock_moved = False
        with self._lock:
            self._reset_locked()
            if self.settings.state_file:
                self._restore_locked()

    # --- vast.ai API ---

    def search(self, body: dict) -> list[dict]:
        try:
            query = parse_query(body)
        except QueryError as exc:
            raise MarketError(400, "invalid_args", str(exc)) from exc
        with self._transaction():
            listings = [
                offer.listing(is_bid=query.is_bid, allocated_storage_gb=query.allocated_storage_gb)
                for offer in self._offers
                if not offer.gone and offer.rented_by is None
            ]
            try:
                return select(listings, query)
            except QueryError as exc:
                raise MarketError(400, "invalid_args", str(exc)) from exc

    def rent(self, offer_id: int, body: dict) -> int:
        with self._transaction() as now:
            offer = self._offers_by_id.get(offer_id)
            if offer is None or offer.gone or offer.rented_by is not None:
                raise _no_such_ask(offer_id)
            if self._fail_next_rents:
                # Someone else rented it between the search and this rent.
                self._fail_next_rents -= 1
                offer.gone = True
                raise _no_such_ask(offer_id)
            request = _rent_request(offer, body)
            link = self._volume_link_locked(offer, request["volume"], now)
            instance = self._new_instance(offer, request, now)
            if link is not None:
                volume, mount_path = link
                volume.instances.append(instance.id)
                instance.volume_info = [{"id": volume.id, "mount_path": mount_path, "total_space": volume.size_gb,
                                         "avail_space": volume.size_gb}]
            instance.log_boot(now)
            self._instances[instance.id] = instance
            offer.rented_by = instance.id
            self._emit("on_rented", instance, now)
            return instance.id

    def list_instances(self) -> list[dict]:
        with self._transaction() as now:
            return [i.view(now) for i in self._instances.values() if i.listed(now)]

    def get_instance(self, instance_id: int) -> dict:
        with self._transaction() as now:
            return self._listed(instance_id, now).view(now)

    def destroy(self, instance_id: int) -> None:
        with self._transaction() as now:
            instance = self._listed(instance_id, now)
            _close_gpu_billing(instance, now)
            instance.state = "destroyed"
            instance.destroyed_at = now
            self._unlink_volumes_locked(instance)
            if not instance.offer.gone:
                instance.offer.rented_by = None  # the machine goes back on the market
            self._emit("on_destroyed", instance, now)

    def container_instance(self, key: str) -> int | None:
        """The listed instance whose own key (CONTAINER_API_KEY) this is, or None."""
        with self._transaction() as now:
            return next((i.id for i in self._instances.values() if i.listed(now) and i.container_api_key
                         and hmac.compare_digest(i.container_api_key.encode(), key.encode())), None)

    def manage(self, instance_id: int, body: dict) -> None:
        """`PUT /instances/{id}/`: {"state": "stopped"|"running"} and/or {"label": ...}."""
        with self._transaction() as now:
            instance = self._listed(instance_id, now)
            if "label" in body:
                instance.label = str(body["label"])
            wanted = body.get("state")
            if wanted is None:
                return
            if instance.state == "dead":
                raise MarketError(400, "machine_offline", f"Machine {instance.offer.machine_id} is offline.")
            if wanted == "stopped" and instance.state == "active":
                _close_gpu_billing(instance, now)
                instance.state = "stopped"
                instance.intended_status = "stopped"
                instance.stop_msg = "Instance stopped by user"
                instance.log_end(now, instance.stop_msg)
                self._emit("on_stopped", instance, now)
            elif wanted == "running" and instance.state == "stopped":
                self._start_locked(instance, now)
            elif wanted not in ("stopped", "running"):
                raise MarketError(400, "invalid_args", f"state {wanted!r} is not stopped or running")

    def change_bid(self, instance_id: int, body: dict) -> str:
        """`PUT /instances/bid_price/{id}/` {"price": $/h for the machine, or null: the winning bid}: the new price
        bills from now; below the machine's current minimum bid a running instance is outbid (stopped), at or above
        it an outbid one resumes. Returns what happened, for the answer's msg."""
        price = body.get("price")
        if price is not None and (isinstance(price, bool) or not isinstance(price, (int, float))
                                  or not 0.001 <= price <= 128):
            raise MarketError(400, "invalid_args", "price must be a bid in $/h between 0.001 and 128, or null")
        with self._transaction() as now:
            instance = self._listed(instance_id, now)
            if not instance.is_bid:
                raise MarketError(400, "invalid_args", f"instance {instance_id} is on-demand: it has no bid to change")
            if instance.state == "dead":
                raise MarketError(400, "machine_offline", f"Machine {instance.offer.machine_id} is offline.")
            winning = instance.offer.min_bid
            price = float(winning if price is None else price)
            _reprice_gpu(instance, now, price)
            outbid = instance.state == "stopped" and instance.intended_status == "running"
            if instance.state == "active" and price < winning:
                self._outbid_locked(instance, now)
                return f"bid ${price:g}/h is under the winning ${winning:g}/h: the instance is outbid and stopped"
            if outbid and price >= winning:
                self._start_locked(instance, now)
                return f"bid ${price:g}/h wins the machine again: the instance starts"
            return f"bid changed to ${price:g}/h"

    def reboot(self, instance_id: int) -> None:
        """`PUT /instances/reboot/{id}/`: the container stops and starts on the same machine; GPU time bills again
        from "running"."""
        with self._transaction() as now:
            instance = self._listed(instance_id, now)
            if instance.state == "dead":
                raise MarketError(400, "machine_offline", f"Machine {instance.offer.machine_id} is offline.")
            if instance.state != "active":
                raise MarketError(400, "invalid_args", f"instance {instance_id} is stopped: start it instead")
            _close_gpu_billing(instance, now)
            instance.log_end(now, "Container stopped for a reboot")
            self._emit("on_stopped", instance, now)
            self._start_locked(instance, now)

    def ssh_keys(self, action: str, *args):
        """The account's SSH keys and the ones attached to an instance (fleet/simulator/keys.py): `action` is add,
        listing, update, delete, attach or detach; an unknown id is 404, a key that is no public key 400."""
        with self._transaction() as now:
            if action in ("attach", "detach"):
                self._listed(args[0], now)
            try:
                done = getattr(self._ssh_keys, action)(*args)
            except SshKeyError as exc:
                raise MarketError(400, "invalid_args", str(exc)) from exc
            if done is False:
                raise MarketError(404, "no_such_key", "No such ssh key" + (" on that instance" if action == "detach"
                                                                            else ""))
            return done

    # --- volumes (fleet/simulator/volumes.py) ---

    def search_volumes(self, body: dict) -> list[dict]:
        """`POST /volumes/search/`: each machine's free disk as a volume offer, through the offer search's filters
        on the fields a volume offer holds; `allocated_storage` asks for that much free disk, as for offers."""
        conditions = {k: v for k, v in body.items() if k not in ("order", "limit", "allocated_storage")}
        wanted_gb = body.get("allocated_storage") or 1.0
        try:
            filters = parse_filters(conditions)
            if not isinstance(wanted_gb, int | float) or isinstance(wanted_gb, bool):
                raise QueryError("allocated_storage must be a number of GB")
            with self._transaction():
                listings = [volumes.volume_offer(offer, self._volume_gb_locked(offer.machine_id))
                            for offer in self._offers if not offer.gone]
                if listings:
                    check_fields(filters, listings[0])
                found = [listing for listing in matching(listings, filters) if listing["disk_space"] >= wanted_gb]
                limit = body.get("limit")
                return ordered(found, _order_by_pairs(body.get("order")))[:limit if isinstance(limit, int) else None]
        except QueryError as exc:
            raise MarketError(400, "invalid_args", str(exc)) from exc

    def create_volume(self, body: dict) -> str:
        """`PUT /volumes/` {"id": volume offer, "size", "name"?}: a volume on that machine; its name, "V.<id>"."""
        offer_id, size = body.get("id"), body.get("size", volumes.DEFAULT_SIZE_GB)
        if not isinstance(offer_id, int) or isinstance(offer_id, bool):
            raise MarketError(400, "invalid_args", "id must be the volume offer's id")
        if not isinstance(size, int | float) or isinstance(size, bool) or size <= 0:
            raise MarketError(400, "invalid_args", "size must be a number of GB > 0")
        with self._transaction() as now:
            return f"V.{self._new_volume_locked(offer_id, float(size), str(body.get('name') or ''), now).id}"

    def list_volumes(self) -> list[dict]:
        with self._transaction() as now:
            return [v.view(self._offers_by_id[v.offer_id], now) for v in self._volumes.values()]

    def delete_volume(self, volume_id: int) -> None:
        """Deletes a volume and what it held; refused while an instance links it, as vast.ai refuses it."""
        with self._transaction():
            volume = self._volumes.get(volume_id)
            if volume is None:
                raise MarketError(404, "no_such_volume", f"Volume {volume_id} not found.")
            if volume.instances:
                raise MarketError(400, "invalid_args", f"Volume {volume_id} is linked to instance(s) "
                                  f"{', '.join(map(str, volume.instances))}: destroy them first.")
            del self._volumes[volume_id]
            self._volume_events.append(("on_volume_deleted", volume_id))

    def _volume_gb_locked(self, machine_id: int) -> float:
        return sum(v.size_gb for v in self._volumes.values() if v.machine_id == machine_id)

    def _new_volume_locked(self, offer_id: int, size_gb: float, name: str, now: float) -> Volume:
        offer = self._offers_by_id.get(offer_id)
        if offer is None or offer.gone:
            raise MarketError(404, "no_such_ask", f"No volume offer {offer_id}.")
        if size_gb > offer.disk_space - self._volume_gb_locked(offer.machine_id):
            raise MarketError(400, "invalid_args", f"{size_gb:g} GB is more than machine {offer.machine_id} has free")
        volume = Volume(id=self._next_instance_id, machine_id=offer.machine_id, offer_id=offer.id, size_gb=size_gb,
                        name=name, created_at=now)
        self._next_instance_id += self._rng.randint(1, 40)  # volumes are contracts: ids from the instances' count
        self._volumes[volume.id] = volume
        return volume

    def _volume_link_locked(self, offer: Offer, link: dict | None, now: float) -> tuple[Volume, str] | None:
        """The volume a rent links (an existing one on this machine, or one created on it), with its mount path."""
        if link is None:
            return None
        if link["create_new"]:
            if link["volume_id"] != offer.id:
                raise MarketError(400, "invalid_args", f"volume offer {link['volume_id']} is not on the machine of "
                                  f"offer {offer.id}: a new volume is created on the instance's machine")
            return self._new_volume_locked(offer.id, link["size_gb"], link["name"], now), link["mount_path"]
        volume = self._volumes.get(link["volume_id"])
        if volume is None:
            raise MarketError(404, "no_such_volume", f"Volume {link['volume_id']} not found.")
        if volume.machine_id != offer.machine_id:
            raise MarketError(400, "invalid_args", f"volume {volume.id} is on machine {volume.machine_id}, not on "
                              f"machine {offer.machine_id} of offer {offer.id}: a volume links only to an instance "
                              "on its own machine")
        return volume, link["mount_path"]

    def _unlink_volumes_locked(self, instance: Instance) -> None:
        for linked in instance.volume_info:
            volume = self._volumes.get(linked["id"])
            if volume is not None and instance.id in volume.instances:
                volume.instances.remove(instance.id)

    def charges(self) -> list[dict]:
        with self._transaction() as now:
            return [line for i in self._instances.values() for line in billing.charge_lines(i, now)]

    def instances_page(self, query: dict) -> dict:
        """`GET /api/v1/instances/`: select_filters, order_by [{col, dir}], limit (5 a page unless told, 25 at
        most), after_token, select_cols; answers `instances`, `next_token`, `total_instances` and `label_counts` as
        vast.ai's v1 does."""
        try:
            filters = parse_filters(json_arg(query.get("select_filters"), "select_filters", {}))
            order = _order_by(json_arg(query.get("order_by"), "order_by", [{"col": "id", "dir": "asc"}]))
            columns = json_arg(query.get("select_cols"), "select_cols", ["*"])
            with self._transaction() as now:
                rows = [i.view(now) for i in self._instances.values() if i.listed(now)]
            rows = ordered(matching(rows, filters), order)
            page, next_token = paginate(rows, _page_size(query.get("limit")), query.get("after_token"))
        except QueryError as exc:
            raise MarketError(400, "invalid_args", str(exc)) from exc
        if isinstance(columns, list) and "*" not in columns:
            page = [{name: row.get(name) for name in columns} for row in page]
        labels: dict[str, int] = {}
        for row in rows:
            labels[row["label"]] = labels.get(row["label"], 0) + 1
        return {"instances": page, "next_token": next_token, "total_instances": len(rows), "label_counts": labels}

    def instance_filters(self) -> list[dict]:
        """`GET /instances/filters/`: the distinct (status, verification, GPU) combinations of the listed instances."""
        with self._transaction() as now:
            combos = {(v["actual_status"], v["verification"], v["gpu_name"])
                      for v in (i.view(now) for i in self._instances.values() if i.listed(now))}
        return [{"actual_status": a, "verification": b, "gpu_name": c} for a, b, c in sorted(combos)]

    def instance_logs(self, instance_id: int, body: dict) -> str:
        """`PUT /instances/request_logs/{id}/`: the container's log, then what ran in it; `tail` lines, `filter`."""
        with self._transaction() as now:
            instance = self._listed(instance_id, now)
            lines = instance.container_log(now)
        lines += self.hooks.logs(instance_id).splitlines()
        pattern = body.get("filter")
        if pattern:
            lines = [line for line in lines if str(pattern) in line]
        tail = body.get("tail")
        if tail not in (None, ""):
            try:
                tail = int(tail)
            except (TypeError, ValueError) as exc:
                raise MarketError(400, "invalid_args", "tail must be a number of lines") from exc
            lines = lines[-tail:] if tail > 0 else []
        return "\n".join(lines) + "\n"

    def user(self) -> dict:
        with self._transaction() as now:
            return account.user(list(self._instances.values()), now, self._started_at,
                                self.settings.starting_credit_usd)

    def invoices(self, query: dict) -> dict:
        """`GET /users/me/invoices?sdate=&edate=&inc_charges=` (the CLI's deprecated `show invoices`)."""
        try:
            since = _number_arg(query.get("sdate"), "sdate")
            until = _number_arg(query.get("edate"), "edate")
        except QueryError as exc:
            raise MarketError(400, "invalid_args", str(exc)) from exc
        include = str(query.get("inc_charges", "true")).lower() not in ("false", "0")
        with self._transaction() as now:
            return account.invoices_v0(list(self._instances.values()), now, self._started_at,
                                       self.settings.starting_credit_usd, since=since, until=until,
                                       include_charges=include)

    def charges_report(self, query: dict) -> dict:
        try:
            with self._transaction() as now:
                instances = list(self._instances.values())
                return account.charges_report(instances, now, **_report_args(query))
        except QueryError as exc:
            raise MarketError(400, "invalid_args", str(exc)) from exc

    def invoices_report(self, query: dict) -> dict:
        try:
            with self._transaction() as now:
                return account.invoices_report(now, self._started_at, self.settings.starting_credit_usd,
                                               **_report_args(query))
        except QueryError as exc:
            raise MarketError(400, "invalid_args", str(exc)) from exc

    # --- request gates (real time) ---

    def take_request_fault(self, path: str) -> Failure | None:
        with self._lock:
            return self._request_faults.take(path)

    def search_retry_after(self, client: str) -> int | None:
        with self._lock:
            return self._search_limit.retry_after(client, time.monotonic())

    def charges_retry_after(self, client: str) -> int | None:
        with self._lock:
            return self._charges_limit.retry_after(client, time.monotonic())

    # --- control (the simulation's own knobs) ---

    def reset(self) -> None:
        """Back to the seed's catalogue, no instances, no faults, the clock restarted at real time."""
        with self._transaction() as now:
            for instance in self._instances.values():
                if instance.listed(now):
                    self._emit("on_destroyed", instance, now)
            self._reset_locked()
            self._clock_moved = True

    def advance(self, seconds: object) -> float:
        """Moves the clock on by what a client sent, checked here."""
        if not isinstance(seconds, (int, float)) or seconds < 0:
            raise MarketError(400, "invalid_args", "seconds must be a number >= 0")
        with self._lock:
            self.clock.advance(seconds)
            self._clock_moved = True
        with self._transaction() as now:
            return now

    def tick(self) -> None:
        """Bring the state up to the clock, firing due hooks; the marketplace's ticker thread calls it."""
        with self._transaction():
            pass

    def inject_faults(self, *, http_429: int = 0, retry_after_s: int = 5, http_5xx: int = 0, status_5xx: int = 503,
                      path_contains: str = "", offers_gone=(), fail_next_rents: int = 0,
                      driver_too_old_offers=(), retry_after: str | None = None) -> dict:
        try:
            offers_gone, driver_too_old_offers = list(offers_gone), list(driver_too_old_offers)
            counts = int(http_429), int(retry_after_s), int(http_5xx), int(status_5xx), int(fail_next_rents)
        except (TypeError, ValueError) as exc:
            raise MarketError(400, "invalid_args", f"bad fault values: {exc}") from exc
        http_429, retry_after_s, http_5xx, status_5xx, fail_next_rents = counts
        if status_5xx not in (500, 502, 503):
            raise MarketError(400, "invalid_args", f"status_5xx {status_5xx} is not 500, 502 or 503")
        if retry_after is not None and not (isinstance(retry_after, str) and retry_after.isprintable()
                                            and 0 < len(retry_after) <= 100):
            raise MarketError(400, "invalid_args", "retry_after must be header text of 1-100 printable characters")
        with self._transaction():
            self._request_faults.add(429, http_429, retry_after_s, str(path_contains), retry_after)
            self._request_faults.add(status_5xx, http_5xx, None, str(path_contains), retry_after)
            for offer_id in offers_gone:
                self._offer(offer_id).gone = True
            self._fail_next_rents += fail_next_rents
            for offer_id in driver_too_old_offers:
                self._driver_too_old_offers.add(self._offer(offer_id).id)
            return self._faults_view()

    def kill_host(self, instance_id: int, vanish_after_s: float | None = None) -> None:
        with self._transaction() as now:
            instance = self._listed(instance_id, now)
            if instance.state == "dead":
                return
            self._die(instance, now, self.settings.dead_listed_s if vanish_after_s is None else vanish_after_s,
                      "killed through the control API")

    def hang_host(self, instance_id: int) -> None:
        with self._transaction() as now:
            instance = self._listed(instance_id, now)
            if instance.state == "dead":
                raise MarketError(400, "invalid_args", "a dead host cannot hang")
            if not instance.hung:
                instance.hung = True
                self._emit("on_hung", instance, now)

    def reclaim(self, instance_id: int) -> None:
        """An interruptible instance loses its machine to a higher bid: stopped, disk kept, GPU billing stops."""
        with self._transaction() as now:
            instance = self._listed(instance_id, now)
            if not instance.is_bid:
                raise MarketError(400, "invalid_args", "only interruptible (bid) instances are reclaimed")
            if instance.state != "active":
                raise MarketError(400, "invalid_args", f"instance is {instance.state}, not running")
            # Another client's bid above this one took the machine: it is now the bid to beat.
            instance.offer.min_bid = max(instance.offer.min_bid, round(instance.gpu_usd_per_hour * 1.15 + 0.005, 3))
            self._outbid_locked(instance, now)

    def set_uplink(self, instance_id: int, mbps: float) -> None:
        """Slow the host's real uplink (what the future on-box agent's uploads will get)."""
        with self._transaction() as now:
            self._listed(instance_id, now).effective_inet_up_mbps = float(mbps)

    def report_traffic(self, instance_id: int, upload_gb: float = 0.0, download_gb: float = 0.0) -> None:
        if any(not isinstance(x, (int, float)) or x < 0 for x in (upload_gb, download_gb)):
            raise MarketError(400, "invalid_args", "upload_gb and download_gb must be numbers >= 0")
        with self._transaction() as now:
            instance = self._listed(instance_id, now)
            instance.upload_gb += upload_gb
            instance.download_gb += download_gb
            if instance.traffic_first_at is None:
                instance.traffic_first_at = now
            instance.traffic_last_at = now

    def state(self) -> dict:
        with self._transaction() as now:
            instances = [
                {**i.view(now), **i.hidden(now), "billing": billing.totals(i, now)} for i in self._instances.values()
            ]
            return {
                "clock": round(now, 3),
                "speed": self.clock.speed,
                "boot_delay_s": self.settings.boot_delay_s,
                "seed": self.settings.seed,
                "instances": instances,
                "billing_total": round(sum(i["billing"]["total"] for i in instances), 6),
                "offers": {
                    "listed": sum(1 for o in self._offers if not o.gone and o.rented_by is None),
                    "rented": sum(1 for o in self._offers if o.rented_by is not None),
                    "gone": sum(1 for o in self._offers if o.gone),
                },
                "faults": self._faults_view(),
            }

    def offers(self) -> list[dict]:
        """Every offer with its hidden truths (dies_after_s, effective uplink), rented and gone ones included."""
        with self._transaction():
            return [offer.hidden() for offer in self._offers]

    # --- inside the lock ---

    def _reset_locked(self) -> None:
        s = self.settings
        self.clock = SimClock(s.speed)
        self._started_at = self.clock.now()
        self._offers: list[Offer] = build_catalogue(s.seed, s.offer_count)
        self._offers_by_id = {offer.id: offer for offer in self._offers}
        self._instances: dict[int, Instance] = {}
        self._volumes: dict[int, Volume] = {}
        self._volume_events: list[tuple[str, int]] = []
        self._rng = random.Random(s.seed * 1_000_003 + 1)
        # A reset, too, never hands out an id again.
        self._next_instance_id = max(self._rng.randint(20_000_000, 29_000_000), getattr(self, "_next_instance_id", 0))
        self._fail_next_rents = 0
        self._ssh_keys = SshKeys()
        self._driver_too_old_offers: set[int] = set()
        self._request_faults = RequestFaults()
        self._search_limit = SlidingWindowLimit(s.search_limit_per_min, 60.0)
        self._charges_limit = MinInterval(s.charges_min_interval_s)

    def _restore_locked(self) -> None:
        """Where the state file left the marketplace; any part it cannot read leaves a fresh start, with a warning."""
        s = self.settings
        doc = saved.read(s.state_file)
        if doc is None:
            # A first start, or a file lost: ids begin past any an earlier run could have handed out (they grow with
            # the clock), since a dashboard may still hold rows under the seed's ids.
            self._next_instance_id = max(self._next_instance_id, int(time.time()) // 10)
            return
        try:
            self._next_instance_id = max(self._next_instance_id, int(doc["next_instance_id"]))
            if [doc["seed"], doc["offer_count"]] != [s.seed, s.offer_count]:
                log.warning("simulated marketplace: %s was saved with seed %s and %s offers, not %s and %s: its "
                            "instances are not restored", s.state_file, doc["seed"], doc["offer_count"], s.seed,
                            s.offer_count)
                return
            instances = saved.instances(doc, self._offers_by_id)
            kept_volumes = [Volume(**entry) for entry in doc.get("volumes", [])]
            gone = [self._offers_by_id[offer_id] for offer_id in doc["offers_gone"]]
            rented = [(self._offers_by_id[offer_id], int(instance_id))
                      for offer_id, instance_id in doc["offers_rented"]]
            started_at, now = float(doc["started_at"]), saved.clock_now(doc, s.speed)
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("simulated marketplace: %s holds a state that cannot be restored (%r); starting afresh",
                        s.state_file, exc)
            return
        self.clock = SimClock(s.speed, start=now)
        self._started_at = started_at
        for offer in gone:
            offer.gone = True
        for offer, instance_id in rented:
            offer.rented_by = instance_id
        self._volumes = {volume.id: volume for volume in kept_volumes}
        for instance in instances:
            if instance.state == "active" and instance.announced_running:
                # What ran in it went with the marketplace's process: the host starts the container again (its
                # onstart runs anew, as after a host's reboot), and the hooks hear it running once more.
                instance.announced_running = False
                instance.log_lines.append((now, "Container restarted: the marketplace's service came back"))
            self._instances[instance.id] = instance
        log.warning("simulated marketplace: %d instances restored from %s", len(instances), s.state_file)

    def _save_locked(self, now: float) -> None:
        s = self.settings
        if not s.state_file:
            return
        doc = saved.document(seed=s.seed, offer_count=s.offer_count, next_instance_id=self._next_instance_id,
                             started_at=self._started_at, clock=now, offers=self._offers,
                             instances=list(self._instances.values()), volumes=list(self._volumes.values()))
        key = json.dumps({k: v for k, v in doc.items() if k not in ("clock", "saved_at")}, sort_keys=True)
        if key == self._saved_key and not self._clock_moved:
            return  # nothing changed; the clock runs on at its speed from the last write
        try:
            saved.write(s.state_file, doc)
        except OSError:
            log.exception("simulated marketplace: the state could not be written to %s", s.state_file)
            return
        self._saved_key, self._clock_moved = key, False

    def _new_instance(self, offer: Offer, request: dict, now: float) -> Instance:
        rng = self._rng
        instance_id = self._next_instance_id
        self._next_instance_id += rng.randint(1, 40)  # other clients rent in between
        every_address = "0.0.0.0"  # noqa: S104 - how vast.ai reports a mapped port, not a bind
        ports = {port: [{"HostIp": every_address, "HostPort": str(rng.randint(20000, 65000))}]
                 for port in _container_ports(request["env"], request["runtype"])}
        public_ipaddr = f"203.0.113.{rng.randint(1, 254)}"  # TEST-NET-3, never routed
        if self.settings.loopback_boxes:
            public_ipaddr = "127.0.0.1"
            ports.update({port: [{"HostIp": "127.0.0.1", "HostPort": str(_free_local_port())}]
                          for port in ports if port != "22/tcp"})
        needed_cuda = image_cuda_version(request["image"])
        cuda_init_error = ""
        if offer.id in self._driver_too_old_offers or (needed_cuda and needed_cuda > offer.cuda_max_good + 1e-9):
            cuda_init_error = (
                f"{CUDA_803}; driver {offer.driver_version} runs CUDA up to {offer.cuda_max_good}"
                + (f", the image needs CUDA {needed_cuda}" if needed_cuda else "")
            )
        return Instance(
            id=instance_id,
            offer=offer,
            image=request["image"],
            env=request["env"],
            onstart=request["onstart"],
            runtype=request["runtype"],
            label=request["label"],
            disk_gb=request["disk_gb"],
            is_bid=request["price"] is not None,
            gpu_usd_per_hour=offer.dph_base if request["price"] is None else request["price"],
            created_at=now,
            boot_delay_s=self.settings.boot_delay_s,
            ssh_host=f"ssh{rng.randint(1, 9)}.simulated.invalid",  # .invalid never resolves: nothing leaks out
            ssh_port=int(ports["22/tcp"][0]["HostPort"]) if "22/tcp" in ports else rng.randint(20000, 65000),
            public_ipaddr=public_ipaddr,
            ports=ports,
            busy_gpu_util=round(rng.uniform(88.0, 99.0), 1),
            boot_started_at=now,
            # vast.ai bills storage from creation and GPU time from "running": not while the image pulls.
            gpu_billed_since=now + self.settings.boot_delay_s,
            cuda_init_error=cuda_init_error,
            dies_at=now + offer.dies_after_s if offer.dies_after_s else None,
            effective_inet_up_mbps=offer.effective_inet_up_mbps,
            container_api_key=secrets.token_hex(16),
        )

    def _start_locked(self, instance: Instance, now: float) -> None:
        """The container (re)starts: created, loading, then running, when GPU time bills again."""
        instance.state = "active"
        instance.intended_status = "running"
        instance.stop_msg = ""
        instance.boot_started_at = now
        instance.gpu_billed_since = now + instance.boot_delay_s
        instance.announced_running = False
        instance.log_boot(now)

    def _outbid_locked(self, instance: Instance, now: float) -> None:
        _close_gpu_billing(instance, now)
        instance.state = "stopped"
        instance.intended_status = "running"  # the user still wants it; it resumes when the bid wins again
        instance.stop_msg = "Instance stopped: outbid, another client's higher bid took the machine"
        instance.log_end(now, instance.stop_msg)
        self._emit("on_stopped", instance, now)

    def _sync(self, now: float) -> None:
        for instance in self._instances.values():
            if instance.state == "active" and not instance.announced_running:
                booted_at = instance.boot_started_at + instance.boot_delay_s
                if booted_at <= now and (instance.dies_at is None or booted_at < instance.dies_at):
                    instance.announced_running = True
                    self._emit("on_running", instance, now)
                    if instance.hung:  # a hung host freezes what starts on it too (after a restart, say)
                        self._emit("on_hung", instance, now)
            if instance.state in ("active", "stopped") and instance.dies_at is not None and instance.dies_at <= now:
                self._die(instance, instance.dies_at, self.settings.dead_listed_s, "its host failed")
            if instance.state == "dead" and not instance.listed(now) and instance.destroyed_at is None:
                instance.state = "destroyed"
                instance.destroyed_at = instance.vanish_at
                self._unlink_volumes_locked(instance)
                self._emit("on_destroyed", instance, now)

    def _die(self, instance: Instance, at: float, vanish_after_s: float, why: str) -> None:
        _close_gpu_billing(instance, at)
        instance.state = "dead"
        instance.died_at = at
        instance.vanish_at = at + vanish_after_s
        instance.stop_msg = f"Host offline: lost contact with machine {instance.offer.machine_id} ({why})"
        instance.log_end(at, instance.stop_msg)
        instance.offer.gone = True  # an offline host is not listed
        instance.offer.rented_by = None
        log.info("simulated host of instance %s died at %.0f", instance.id, at)
        self._emit("on_host_died", instance, at)

    def _listed(self, instance_id: int, now: float) -> Instance:
        instance = self._instances.get(instance_id)
        if instance is None or not instance.listed(now):
            raise MarketError(404, "no_such_instance", f"Instance {instance_id} not found.")
        return instance

    def _offer(self, offer_id) -> Offer:
        offer = self._offers_by_id.get(offer_id)
        if offer is None:
            raise MarketError(404, "no_such_ask", f"No offer {offer_id} in the catalogue.")
        return offer

    def _faults_view(self) -> dict:
        return {
            "requests": self._request_faults.pending(),
            "fail_next_rents": self._fail_next_rents,
            "offers_gone": sorted(o.id for o in self._offers if o.gone),
            "driver_too_old_offers": sorted(self._driver_too_old_offers),
        }

    def _emit(self, hook: str, instance: Instance, now: float) -> None:
        self._events.append((hook, {**instance.view(now), **instance.hidden(now)}))

    @contextmanager
    def _transaction(self):
        try:
            with self._lock:
                now = self.clock.now()
                self._sync(now)
                try:
                    yield now
                finally:
                    self._save_locked(now)
        finally:
            self._dispatch()

    def _dispatch(self) -> None:
        with self._hook_lock:
            with self._lock:
                events, self._events = self._events, []
                deleted, self._volume_events = self._volume_events, []
            for hook, volume_id in deleted:
                try:
                    getattr(self.hooks, hook)(volume_id)
                except Exception:
                    log.exception("simulator hook %s failed for volume %s", hook, volume_id)
            for hook, view in events:
                try:
                    getattr(self.hooks, hook)(view)
                except Exception:
                    log.exception("simulator hook %s failed for instance %s", hook, view.get("id"))


def _order_by_pairs(value) -> list[tuple[str, bool]]:
    """A search's `order` ([[field, "asc"|"desc"], ...]) as (field, descending) pairs; anything else orders nothing."""
    if not isinstance(value, list):
        return []
    return [(pair[0], pair[1] == "desc") for pair in value
            if isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str)]


def _order_by(value) -> list[tuple[str, bool]]:
    if not isinstance(value, list) or not all(isinstance(o, dict) and isinstance(o.get("col"), str) for o in value):
        raise QueryError('order_by is a list of {"col": name, "dir": "asc"|"desc"}')
    return [(o["col"], str(o.get("dir", "asc")).lower() == "desc") for o in value]


def _number_arg(value, name: str) -> float | None:
    if value in (None, ""):
        return None
    try:
        return float(value)
    except (TypeError, ValueError) as exc:
        raise QueryError(f"{name} must be a unix time") from exc


def _report_args(query: dict) -> dict:
    return {
        "select_filters": json_arg(query.get("select_filters"), "select_filters", {}),
        "latest_first": str(query.get("latest_first", "false")).lower() in ("true", "1"),
        "limit": query.get("limit") or 20,
        "after_token": query.get("after_token"),
    }


def _no_such_ask(offer_id: int) -> MarketError:
    msg = f"error 404/3603: no_such_ask  Instance type by id {offer_id} is not available."
    return MarketError(400, "no_such_ask", msg)


def _close_gpu_billing(instance: Instance, at: float) -> None:
    if instance.gpu_billed_since is not None:
        end = max(at, instance.gpu_billed_since)
        instance.gpu_usd_closed = billing.closed_gpu_usd(instance) + \
            (end - instance.gpu_billed_since) / 3600 * instance.gpu_usd_per_hour
        instance.gpu_intervals.append((instance.gpu_billed_since, end))
        instance.gpu_billed_since = None


def _reprice_gpu(instance: Instance, now: float, price: float) -> None:
    """A new $/h from `now`: what ran so far stays billed at the old one."""
    if instance.gpu_billed_since is not None and instance.gpu_billed_since < now:
        _close_gpu_billing(instance, now)
        instance.gpu_billed_since = now
    instance.gpu_usd_per_hour = price


def _rent_request(offer: Offer, body: dict) -> dict:
    """Validate a `PUT /asks/{id}/` body the way vast.ai does, into plain values."""
    if not isinstance(body, dict):
        raise MarketError(400, "invalid_args", "the body must be a JSON object")
    image = body.get("image")
    if not isinstance(image, str) or not image:
        raise MarketError(400, "invalid_args", "image is required")
    disk_gb = body.get("disk", DEFAULT_DISK_GB)
    if not isinstance(disk_gb, (int, float)) or isinstance(disk_gb, bool) or disk_gb <= 0:
        raise MarketError(400, "invalid_args", "disk must be a number of GB > 0")
    if disk_gb > offer.disk_space:
        raise MarketError(400, "invalid_args", f"disk {disk_gb} GB is more than the {offer.disk_space} GB offered")
    price = body.get("price")
    if price is not None:
        if not isinstance(price, (int, float)) or isinstance(price, bool):
            raise MarketError(400, "invalid_args", "price must be a number of $/h")
        if price < offer.min_bid:
            raise MarketError(400, "invalid_args", f"bid ${price}/h is below this offer's min_bid ${offer.min_bid}/h")
    env = body.get("env") or {}
    if not isinstance(env, (dict, str)):
        raise MarketError(400, "invalid_args", "env must be an object or a string")
    _within_limits(body, env)
    try:
        volume = volumes.link_request(body.get("volume_info"))
    except ValueError as exc:
        raise MarketError(400, "invalid_args", str(exc)) from None
    return {
        "volume": volume,
        "image": image,
        "disk_gb": float(disk_gb),
        "price": None if price is None else float(price),
        "env": env,
        "onstart": str(body.get("onstart") or ""),
        "runtype": str(body.get("runtype") or "ssh"),
        "label": str(body.get("label") or ""),
    }


# vast.ai's documented limits on a rent (its create_instance x-input-validation).
ENV_ENTRY_MAX, ENV_TOTAL_MAX, START_MAX, LABEL_MAX, IMAGE_MAX = 256, 32768, 4096, 256, 1024
BID_MIN, BID_MAX = 0.001, 128.0


def _within_limits(body: dict, env) -> None:
    # A string env (docker flags) is held to the total only; an object's entries each to the entry limit too.
    entries = [len(str(k)) + len(str(v)) + 1 for k, v in env.items()] if isinstance(env, dict) else []
    total = sum(entries) if isinstance(env, dict) else len(env)
    if max(entries, default=0) > ENV_ENTRY_MAX or total > ENV_TOTAL_MAX:
        raise MarketError(400, "invalid_args", f"env: each variable at most {ENV_ENTRY_MAX} characters, "
                                               f"{ENV_TOTAL_MAX} in all")
    args = body.get("args")
    args = args if isinstance(args, list) else []
    start = len(str(body.get("onstart") or "")) + len(str(body.get("args_str") or "")) + sum(len(str(a)) for a in args)
    if start > START_MAX:
        raise MarketError(400, "invalid_args", f"onstart, args and args_str: at most {START_MAX} characters together")
    if len(str(body.get("label") or "")) > LABEL_MAX or len(str(body.get("image"))) > IMAGE_MAX:
        raise MarketError(400, "invalid_args", f"label at most {LABEL_MAX} characters, image {IMAGE_MAX}")
    price = body.get("price")
    if price is not None and not BID_MIN <= price <= BID_MAX:
        raise MarketError(400, "invalid_args", f"price must be between {BID_MIN} and {BID_MAX} $/h")


def _free_local_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _container_ports(env, runtype: str) -> list[str]:
    """Ports to map: vast.ai reads docker-style "-p 8000:8000" options from env keys (or an env string)."""
    words = env.split() if isinstance(env, str) else [w for key in env for w in str(key).split()]
    ports = ["22/tcp"] if "ssh" in runtype else []
    for flag, value in pairwise(words):
        if flag == "-p":
            container = value.split(":")[-1]
            port = container if "/" in container else f"{container}/tcp"
            if port not in ports:
                ports.append(port)
    return ports


def _page_size(limit) -> int:
    """vast.ai's v1 instance pages: 5 rows when no limit (or one <= 0) is given, never more than 25."""
    try:
        asked = int(limit) if limit not in (None, "") else 0
    except (TypeError, ValueError) as exc:
        raise QueryError("limit must be an integer") from exc
    return 5 if asked <= 0 else min(asked, 25)

