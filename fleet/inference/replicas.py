"""The inference fleet: keep each InferenceModel at its desired number of replicas, within a daily budget; `plan`
decides, `maintain` acts (docs/fleet.md, "fleet/inference/replicas.py")."""

import dataclasses
import logging
import shlex
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta

from django.conf import settings
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from fleet import actions
from fleet.alerts.notify import raise_alert
from fleet.inference import adapters, checkin
from fleet.models import Alert, InferenceModel, Instance, Offer, ProbeResult
from fleet.offers.ranked import rent_settings

log = logging.getLogger(__name__)
State = Instance.State

# Live and meant to serve; STOPPING is live for billing but is on its way out.
REPLICA_STATES = (State.REQUESTED, State.PROVISIONING, State.RUNNING)
AVOID_FAILED_MACHINES_FOR = timedelta(hours=24)


# -- the decision (pure) --------------------------------------------------------------------------------------------


def failing_threshold() -> int:
    return settings.REAPER_PROBE_FAILURES  # the count at which the reaper destroys a serving box


def is_replica(state: str, consecutive_probe_failures: int, threshold: int) -> bool:
    return state in REPLICA_STATES and consecutive_probe_failures < threshold


def checkin_refusal(*, state: str, serves_model: bool, kept: bool) -> str:
    """Why the dashboard no longer wants a serving box that checks in (it then stops its own machine), or "" to
    let it go on. A box kept for debugging goes on; a failing one too (the reaper, not its own switch, ends it)."""
    if kept:
        return ""
    if state == State.STOPPING:
        return "it is being destroyed"
    if state not in REPLICA_STATES:
        return f"it is {state}"
    if not serves_model:
        return "its inference model is gone"
    return ""


@dataclass(frozen=True)
class ModelState:
    model_id: int
    name: str
    desired_replicas: int
    live_replicas: int
    rented_today: int  # serving boxes requested for this model since 00:00 UTC
    max_replacements_per_day: int
    # Of the live replicas, those a probe of /v1/models has passed on since they started; the rest are starting.
    # The plan counts both (a starting box is one not to rent again); a person reads "live" as serving.
    probed_replicas: int = 0

    @property
    def starting_replicas(self) -> int:
        return self.live_replicas - self.probed_replicas


@dataclass(frozen=True)
class Rental:
    slot: int  # which replica this fills, 1-based
    count: int  # the how-manieth rent of the day for this model, 1-based
    idempotency_key: str


@dataclass(frozen=True)
class Plan:
    model_id: int
    missing: int
    rentals: tuple[Rental, ...] = ()
    over_budget: int = 0  # missing replicas the budget does not cover

    @property
    def reason(self) -> str:
        if not self.missing:
            return "at its desired replicas"
        words = f"{self.missing} replica(s) short"
        if self.over_budget:
            words += f"; {self.over_budget} not rented: the daily replacement budget is spent"
        return words


def replacement_key(model_id: int, slot: int, day: date, count: int) -> str:
    return f"inference-{model_id}-{day:%Y%m%d}-slot{slot}-n{count}"


def plan(model: ModelState, day: date) -> Plan:
    """How many replacements to rent for one model today, and under which keys."""
    missing = max(0, model.desired_replicas - model.live_replicas)
    budget_left = max(0, model.max_replacements_per_day - model.rented_today)
    to_rent = min(missing, budget_left)
    rentals = tuple(
        Rental(slot=model.live_replicas + i + 1, count=model.rented_today + i + 1,
               idempotency_key=replacement_key(model.model_id, model.live_replicas + i + 1, day,
                                               model.rented_today + i + 1))
        for i in range(to_rent))
    return Plan(model.model_id, missing, rentals, missing - to_rent)


# -- acting on it ---------------------------------------------------------------------------------------------------


@dataclass
class ModelReport:
    model: str
    desired: int
    live: int
    rented: list[str] = field(default_factory=list)  # instance labels
    over_budget: int = 0
    note: str = ""


@dataclass
class FleetReport:
    models: list[ModelReport] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {m.model: {"desired": m.desired, "live": m.live, "rented": m.rented, "over_budget": m.over_budget,
                          "note": m.note} for m in self.models}


def day_start(now: datetime) -> datetime:
    return now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


def model_states(now: datetime) -> list[tuple[InferenceModel, ModelState]]:
    """Every model with its live replicas and today's rents, in a constant number of queries."""
    threshold = failing_threshold()
    models = list(InferenceModel.objects.select_related("profile").order_by("name"))
    live: dict[int, int] = {}
    probed: dict[int, int] = {}
    today: dict[int, int] = {}
    for model_id, state, failures, passed in Instance.objects.filter(
            serving_model__in=models, state__in=REPLICA_STATES).annotate(
            passed=Exists(ProbeResult.objects.filter(instance=OuterRef("pk"), ok=True))).values_list(
            "serving_model_id", "state", "consecutive_probe_failures", "passed"):
        replica = is_replica(state, failures, threshold)
        live[model_id] = live.get(model_id, 0) + replica
        probed[model_id] = probed.get(model_id, 0) + (replica and passed and state == State.RUNNING)
    for model_id in Instance.objects.filter(serving_model__in=models, purpose="serving",
                                            requested_at__gte=day_start(now)).values_list("serving_model_id",
                                                                                          flat=True):
        today[model_id] = today.get(model_id, 0) + 1
    return [(m, ModelState(m.pk, m.name, m.desired_replicas, live.get(m.pk, 0), today.get(m.pk, 0),
                           m.max_replacements_per_day, probed.get(m.pk, 0))) for m in models]


def machines_to_avoid(model: InferenceModel, now: datetime) -> set[str]:
    """Machines where a box of this model failed (or is failing) recently; rows from before instances kept their
    machine id are looked up through the offer they were rented from. A rent that rented nothing (a rate limit, a
    refused request, an offer taken first) says nothing of the machine."""
    failed = Instance.objects.filter(serving_model=model, requested_at__gte=now - AVOID_FAILED_MACHINES_FOR).filter(
        Q(consecutive_probe_failures__gte=failing_threshold()) | ~Q(failure_reason="") | ~Q(reap_reason="")
        | Q(state=State.FAILED)).exclude(Q(provider_instance_id=None) | Q(provider_instance_id=""))
    machines, unknown = set(), set()
    for provider, offer_id, machine_id in failed.values_list("provider", "offer_id", "machine_id"):
        if machine_id:
            machines.add(machine_id)
        else:
            unknown.add((provider, offer_id))
    if unknown:
        q = Q()
        for provider, offer_id in unknown:
            q |= Q(provider=provider, offer_id=offer_id)
        machines |= set(Offer.objects.filter(q).exclude(machine_id="").values_list("machine_id", flat=True))
    return machines


def serving_env(model: InferenceModel, instance: Instance) -> dict[str, str]:
    """What a box of this model gets in its environment, made when it is rented (an adapter's read grant expires):
    its own check-in token and the watchdog's files too."""
    # vast.ai maps the ports named as docker "-p" options in env keys; without it /v1/models has no public port.
    env = {f"-p {model.port}:{model.port}": "1", **checkin.box_env(instance)}
    if model.serves_adapter:
        env.update(adapters.box_env(model))
    return env


def serving_onstart(model: InferenceModel) -> str:
    """The box's start script: the watchdog first (checkin.START), then vLLM."""
    if model.serves_adapter:
        return adapters.start_script(model)
    # An ssh-type box does not run the image's entrypoint, so the serving command is the box's start script.
    return "\n".join(['root="${FLEET_WORKDIR:-/workspace}"', 'mkdir -p "$root"', checkin.START,
                      *adapters.TENSOR_PARALLEL,
                      f"nohup vllm serve {shlex.quote(model.name)} --host 0.0.0.0 --port {model.port} "
                      '--tensor-parallel-size "$tp" >> "$root/vllm.log" 2>&1 &', ""])


def rank_settings(model: InferenceModel):
    """What this model's boxes are ranked with: its profile (or the defaults), needing the model's VRAM when known."""
    recipe, filters = rent_settings(model.profile, model.image)
    if model.vram_needed_gb:
        recipe = dataclasses.replace(recipe, model=model.base_model or model.name, vram_needed_gb=model.vram_needed_gb)
    return recipe, filters


def _replaced(model: InferenceModel) -> Instance | None:
    """The latest box of this model that is no longer a replica and that nothing replaced yet."""
    threshold = failing_threshold()
    gone = Instance.objects.filter(serving_model=model, replaced_by__isnull=True).filter(
        ~Q(state__in=REPLICA_STATES) | Q(consecutive_probe_failures__gte=threshold))
    return gone.order_by("-requested_at").first()


def _resume_unrented(model: InferenceModel, now: datetime) -> list[str]:
    """A task that died between writing a row and calling the provider left a row that counts as a replica but was
    never rented: rent it now (actions.rent calls the provider at most once per row)."""
    rented = []
    for instance in Instance.objects.filter(serving_model=model, state=State.REQUESTED, rent_attempted_at=None):
        rented.append(actions.rent(instance.pk, now=now, env=serving_env(model, instance),
                                   onstart=serving_onstart(model)).label)
    return rented


def maintain(*, now: datetime | None = None) -> FleetReport:
    now = now or timezone.now()
    report = FleetReport()
    for model, state in model_states(now):
        decision = plan(state, now.astimezone(UTC).date())
        entry = ModelReport(model.name, state.desired_replicas, state.live_replicas,
                            rented=_resume_unrented(model, now), over_budget=decision.over_budget,
                            note=decision.reason)
        report.models.append(entry)
        if decision.rentals:
            entry.rented += _rent_replacements(model, decision.rentals, now, entry)
        if decision.over_budget:
            _alert_over_budget(model, state, decision, now)
    return report


def _rent_replacements(model: InferenceModel, rentals, now: datetime, entry: ModelReport) -> list[str]:
    avoid = machines_to_avoid(model, now)
    # (provider, offer id): an offer is one machine's GPUs: two replicas of one run go to two offers, and two machines
    taken: set[tuple[str, str]] = set()
    rented = []
    for rental in rentals:
        def replica(instance: Instance, rental=rental) -> None:
            replaced = _replaced(model)
            Instance.objects.filter(pk=instance.pk).update(serving_model=model, replaces=replaced)
            actions.record_event(instance, "inference-replica",
                                 f"Replica {rental.slot} of {model.name} (rent {rental.count} of "
                                 f"{model.max_replacements_per_day} today)"
                                 + (f", replacing {replaced.label}" if replaced else ""), now)

        done = actions.rent_best(*rank_settings(model), idempotency_key=rental.idempotency_key,
                                 purpose="serving", image=model.image, avoid_machines=avoid,
                                 avoid_offers=frozenset(taken), env=lambda row: serving_env(model, row),
                                 onstart=serving_onstart(model), on_requested=replica, now=now)
        if done is None:
            entry.note += f"; no offer passes the filters{' off the machines that failed' if avoid else ''}"
            log.warning("inference fleet: %s is short of replicas and no offer passes the filters", model.name)
            break
        taken.add((done.instance.provider, done.instance.offer_id))
        if done.instance.machine_id:
            avoid.add(done.instance.machine_id)
        if done.created:  # an earlier pass wrote a row of that key: it counts already and was resumed, not rented now
            rented.append(done.instance.label)
    return rented


def _alert_over_budget(model: InferenceModel, state: ModelState, decision: Plan, now: datetime) -> None:
    # There is no alert kind of its own for this; a spent budget is a spending limit hit. Once a model a day.
    prefix = f"Inference fleet: {model.name} "
    if Alert.objects.filter(kind=Alert.Kind.SPEND_CAP_HIT, message__startswith=prefix,
                            created_at__gte=day_start(now)).exists():
        return
    rented = len(decision.rentals)
    message = (f"{prefix}has {state.live_replicas + rented} of {state.desired_replicas} replicas and its replacement "
               f"budget is spent ({state.rented_today + rented} of {state.max_replacements_per_day} rented today): "
               f"{decision.over_budget} not rented until tomorrow (UTC) or until the budget is raised.")
    log.warning(message)
    raise_alert(Alert.Kind.SPEND_CAP_HIT, message, now=now)
