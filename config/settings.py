"""Settings, all read from the environment.

With no DATABASE_URL the product runs on its embedded default: SQLite and a Celery broker kept in files under
DATA_DIR, with the simulated marketplace standing in for vast.ai. DATABASE_URL (PostgreSQL) and REDIS_URL switch to
the production stack.
"""

import re
import secrets
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from config import worker_image
from config.env import env_bool, env_decimal, env_float, env_int, env_list, env_str

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = Path(env_str("DATA_DIR", str(BASE_DIR / "var")))
DATA_DIR.mkdir(parents=True, exist_ok=True)

DATABASE_URL = env_str("DATABASE_URL", "")
REDIS_URL = env_str("REDIS_URL", "")
EMBEDDED = not DATABASE_URL

DEBUG = env_bool("DEBUG", False)


def _embedded_secret_key() -> str:
    # The embedded default keeps a generated key beside its database so sessions survive a restart.
    path = DATA_DIR / "secret_key"
    if not path.exists():
        path.write_text(secrets.token_urlsafe(50))
        path.chmod(0o600)
    return path.read_text().strip()


SECRET_KEY = env_str("SECRET_KEY", "") or (_embedded_secret_key() if EMBEDDED else "")
if not SECRET_KEY:
    raise ImproperlyConfigured("SECRET_KEY is required when DATABASE_URL is set.")
# Django's own rule (`check --deploy`, security.W009), whatever HTTPS says: sessions, password resets and every signed
# value rest on it. The message never shows the key.
if len(SECRET_KEY) < 50 or len(set(SECRET_KEY)) < 5 or SECRET_KEY.startswith("django-insecure-"):
    raise ImproperlyConfigured(
        "SECRET_KEY must be 50 or more random characters (5 or more different ones, not starting with "
        "'django-insecure-'): python -c \"import secrets; print(secrets.token_urlsafe(50))\" makes one.")

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

# HTTPS: on whenever the stack (DATABASE_URL) answers a name beyond loopback, so a public deployment gets secure
# cookies, HSTS and the redirect (`manage.py check --deploy` passes); the embedded default and a stack tried on
# localhost stay plain HTTP. HTTPS=1/0 overrides. Behind a TLS-terminating proxy set SECURE_PROXY_SSL_HEADER to the
# header it sets, e.g. X-Forwarded-Proto (only then: a client could send that header itself).
_LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "[::1]", "::1"}
HTTPS = env_bool("HTTPS", not EMBEDDED and bool(set(ALLOWED_HOSTS) - _LOOPBACK_HOSTS))
if HTTPS:
    SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", True)
    SECURE_REDIRECT_EXEMPT = [r"^healthz$"]  # the container health check speaks plain HTTP inside the network
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 365 * 24 * 3600, minimum=0)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", True)
    SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", True)
    _proxy_header = env_str("SECURE_PROXY_SSL_HEADER", "")
    if _proxy_header:
        SECURE_PROXY_SSL_HEADER = ("HTTP_" + _proxy_header.upper().replace("-", "_"), "https")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_celery_beat",
    "axes",
    "fleet",
    "runs",
]

MIDDLEWARE = [
    "config.csp.ContentSecurityPolicyMiddleware",  # first, so static files and error pages carry the header too
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # Every page needs a login unless its view says otherwise.
    "django.contrib.auth.middleware.LoginRequiredMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "axes.middleware.AxesMiddleware",  # last: turns a locked-out login into the locked-out page
]

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES: dict[str, Any]
if EMBEDDED:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": DATA_DIR / "db.sqlite3",
            # Web, worker and beat share one file: WAL lets readers run beside the writer, IMMEDIATE avoids
            # upgrade deadlocks, and the timeout makes a busy writer wait instead of failing.
            "OPTIONS": {
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
                "transaction_mode": "IMMEDIATE",
                "timeout": 20,
            },
        }
    }
else:
    # Persistent connections are checked before reuse, so a database restart costs a reconnect, not failed tasks.
    DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=env_int("DB_CONN_MAX_AGE", 60),
                                                  conn_health_checks=True)}
    if DATABASES["default"]["ENGINE"].endswith("postgresql"):
        # The claims (fleet.locks) are advisory locks held by a worker's session: when its machine vanishes without
        # closing the connection, the server holds them until TCP says the peer is dead, two hours by the kernel's
        # defaults, and that provider's sync or that run's supervision waits as long. The server probes an idle
        # session after DB_TCP_KEEPALIVE_S and drops it within as long again; the client does the same the other way.
        _keepalive_s = env_int("DB_TCP_KEEPALIVE_S", 60, minimum=1)
        _probe_s = max(_keepalive_s // 6, 1)
        _options = DATABASES["default"].setdefault("OPTIONS", {})
        _options["options"] = " ".join(filter(None, [
            _options.get("options", ""), f"-c tcp_keepalives_idle={_keepalive_s}",
            f"-c tcp_keepalives_interval={_probe_s}", "-c tcp_keepalives_count=6"]))
        _options.update({"keepalives": 1, "keepalives_idle": _keepalive_s, "keepalives_interval": _probe_s,
                         "keepalives_count": 6})

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "dashboard"
LOGOUT_REDIRECT_URL = "login"

# Login throttling (config/login_throttle.py): LOGIN_FAILURE_LIMIT failed logins for one username from one address
# lock that pair out for LOGIN_COOLOFF_MIN minutes, right password or not, on the login page and the admin's.
# Behind a proxy every client shares its address: LOGIN_CLIENT_IP_HEADER names the header the proxy sets with the
# client's (X-Forwarded-For); only then is it read, since a client can send any header itself.
AUTHENTICATION_BACKENDS = ["config.login_throttle.LoginThrottleBackend", "django.contrib.auth.backends.ModelBackend"]
AXES_FAILURE_LIMIT = env_int("LOGIN_FAILURE_LIMIT", 5, minimum=1)
AXES_COOLOFF_TIME = timedelta(minutes=env_int("LOGIN_COOLOFF_MIN", 15, minimum=1))
# One account guessed from many addresses: this many failures for a username from all addresses within the cool-off
# refuse it from everywhere until they age out (high, so that a stranger cannot lock an operator out with a few tries).
LOGIN_ACCOUNT_FAILURE_LIMIT = env_int("LOGIN_ACCOUNT_FAILURE_LIMIT", 50, minimum=1)
# Each address counts toward the account's limit at most LOGIN_FAILURE_LIMIT failures, so an account limit above it
# takes several addresses to reach; at or below it one address could lock the username out for everyone.
if LOGIN_ACCOUNT_FAILURE_LIMIT <= AXES_FAILURE_LIMIT:
    raise ImproperlyConfigured(
        f"LOGIN_ACCOUNT_FAILURE_LIMIT={LOGIN_ACCOUNT_FAILURE_LIMIT} must be above LOGIN_FAILURE_LIMIT="
        f"{AXES_FAILURE_LIMIT}, or one address could lock the username out from every address.")
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
# A login refused because its pair or its account is locked is not recorded: it would count toward the account's
# limit and renew the lock's start, so one address could keep a username locked out for everyone.
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
AXES_RESET_ON_SUCCESS = True
AXES_CLIENT_IP_CALLABLE = "config.login_throttle.client_address"
AXES_LOCKOUT_CALLABLE = "config.login_throttle.locked_out"
_client_ip_header = env_str("LOGIN_CLIENT_IP_HEADER", "")
if _client_ip_header and not re.fullmatch(r"[A-Za-z][A-Za-z0-9-]*", _client_ip_header):
    raise ImproperlyConfigured(f"LOGIN_CLIENT_IP_HEADER={_client_ip_header!r} is not a header name (X-Forwarded-For).")
LOGIN_CLIENT_IP_META_KEY = "HTTP_" + _client_ip_header.upper().replace("-", "_") if _client_ip_header else ""

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATICFILES_FINDERS = [
    "django.contrib.staticfiles.finders.FileSystemFinder",
    "django.contrib.staticfiles.finders.AppDirectoriesFinder",
    "config.static_finders.PlotlyBundleFinder",  # static/vendor/plotly.min.js, from the plotly package
]
STATIC_ROOT = Path(env_str("STATIC_ROOT", str(DATA_DIR / "staticfiles")))
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
}

# Celery: Redis in production; on the embedded default a broker kept in files, which needs no server.
if REDIS_URL:
    CELERY_BROKER_URL = REDIS_URL
    CELERY_RESULT_BACKEND: str | None = REDIS_URL
else:
    _broker_dir = DATA_DIR / "celery-broker"
    _broker_dir.mkdir(parents=True, exist_ok=True)
    # The host is named, though files have none: without one kombu warns on every connection that it assumed one.
    CELERY_BROKER_URL = "filesystem://localhost/"
    CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, object] = {
        "data_folder_in": str(_broker_dir),
        "data_folder_out": str(_broker_dir),
        "control_folder": str(DATA_DIR / "celery-control"),
    }
    CELERY_RESULT_BACKEND = None
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TIMEZONE = "UTC"
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# A web request that queues a task waits about a second for an unreachable broker, then says so (fleet.enqueue).
CELERY_TASK_PUBLISH_RETRY_POLICY = {"max_retries": 2, "interval_start": 0, "interval_step": 0.25, "interval_max": 0.5}
CELERY_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
# Two queues, so a slow rent or destroy (minutes of provider calls) never holds up the probes, syncs and webhooks
# that must run on time; compose runs a worker for each (-Q fast, -Q slow), a worker given no -Q consumes both.
# Every task is named here (tests/test_deploy_settings.py checks). Running several workers per queue is safe: each
# task claims its rows (conditional UPDATE, SELECT ... SKIP LOCKED, an advisory lock or an idempotency key).
CELERY_TASK_QUEUES: dict[str, dict[str, str]] = {"fast": {}, "slow": {}}
CELERY_TASK_DEFAULT_QUEUE = "fast"
_FAST_TASKS = ["fleet.tasks.refresh_offers", "fleet.tasks.rank_profiles", "fleet.tasks.sync_instances",
               "fleet.tasks.reconcile_charges", "fleet.tasks.probe_serving_instances", "fleet.tasks.deliver_webhook",
               "fleet.tasks.retry_webhooks"]
_SLOW_TASKS = ["fleet.tasks.rent_instance", "fleet.tasks.destroy_instance", "fleet.tasks.move_instance",
               "fleet.tasks.reap_instances", "fleet.tasks.maintain_inference_fleet", "runs.tasks.supervise_runs",
               "fleet.tasks.rent_waiting_instances", "runs.tasks.seal_checkpoint", "runs.tasks.record_model_manifest"]
CELERY_TASK_ROUTES = {**{name: {"queue": "fast"} for name in _FAST_TASKS},
                      **{name: {"queue": "slow"} for name in _SLOW_TASKS}}
OFFER_REFRESH_SECONDS = env_int("OFFER_REFRESH_SECONDS", 60, minimum=5)
CELERY_BEAT_SCHEDULE: dict[str, dict[str, object]] = {
    "refresh-offers": {"task": "fleet.tasks.refresh_offers", "schedule": float(OFFER_REFRESH_SECONDS)},
}

# Marketplaces. On the embedded default vast.ai is the simulated marketplace started beside the web app.
SIMULATOR_ENABLED = env_bool("SIMULATOR", EMBEDDED)
SIMULATOR_HOST = env_str("SIMULATOR_HOST", "127.0.0.1")
SIMULATOR_PORT = env_int("SIMULATOR_PORT", 8765, minimum=1)
SIMULATOR_API_KEY = env_str("SIMULATOR_API_KEY", "simulated-key")
SIMULATOR_SPEED = env_float("SIMULATOR_SPEED", 1.0, minimum=0.001)
SIMULATOR_BOOT_DELAY_S = env_float("SIMULATOR_BOOT_DELAY_S", 30.0, minimum=0)
if SIMULATOR_ENABLED:
    VAST_API_URL = env_str("VAST_API_URL", f"http://{SIMULATOR_HOST}:{SIMULATOR_PORT}/api/v0")
    VAST_API_KEY = env_str("VAST_API_KEY", SIMULATOR_API_KEY)
else:
    VAST_API_URL = env_str("VAST_API_URL", "https://console.vast.ai/api/v0")
    VAST_API_KEY = env_str("VAST_API_KEY", "")
RUNPOD_API_URL = env_str("RUNPOD_API_URL", "https://api.runpod.io/graphql")
RUNPOD_API_KEY = env_str("RUNPOD_API_KEY", "")
if RUNPOD_API_KEY:  # RunPod's offers refreshed on the same beat as vast.ai's, and ranked beside them
    CELERY_BEAT_SCHEDULE["refresh-offers-runpod"] = {"task": "fleet.tasks.refresh_offers", "args": ("runpod",),
                                                     "schedule": float(OFFER_REFRESH_SECONDS)}
PROVIDER_TIMEOUT_S = env_float("PROVIDER_TIMEOUT_S", 20.0, minimum=0.1)
PROVIDER_MAX_RETRIES = env_int("PROVIDER_MAX_RETRIES", 4, minimum=0)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    # httpx logs every request line at INFO; keep it at WARNING so a busy worker's log stays readable.
    # axes logs every successful login's reset at INFO; failures and lockouts come at WARNING.
    "loggers": {"httpx": {"level": "WARNING"}, "httpcore": {"level": "WARNING"}, "axes": {"level": "WARNING"}},
}

# Instances
INSTANCE_LABEL_PREFIX = env_str("INSTANCE_LABEL_PREFIX", "moe-fleet")  # names the product on the provider's side
# The GPU worker image (config/worker_image.py): runs rent with WORKER_IMAGE and rank offers with at least the driver
# and CUDA that WORKER_IMAGE_CUDA needs. Either one gives the other (the tag names the CUDA version); both must agree.
try:
    WORKER_IMAGE, WORKER_IMAGE_CUDA = worker_image.resolve(env_str("WORKER_IMAGE", ""),
                                                           env_str("WORKER_IMAGE_CUDA", ""))
except ValueError as exc:
    raise ImproperlyConfigured(f"WORKER_IMAGE / WORKER_IMAGE_CUDA: {exc}.") from None
WORKER_IMAGE_MIN_DRIVER = worker_image.min_driver(WORKER_IMAGE_CUDA)
RENT_DISK_GB = env_int("RENT_DISK_GB", 250, minimum=10)
INSTANCE_SYNC_SECONDS = env_int("INSTANCE_SYNC_SECONDS", 15, minimum=1)
CHARGES_RECONCILE_SECONDS = env_int("CHARGES_RECONCILE_SECONDS", 300, minimum=10)
RENT_OUTCOME_GRACE_S = env_int("RENT_OUTCOME_GRACE_S", 120, minimum=1)  # a rent not listed after this never happened
DESTROY_VERIFY_S = env_int("DESTROY_VERIFY_S", 60, minimum=1)  # a destroy still listed after this is retried
MAX_KEEP_FOR_DEBUG_HOURS = env_int("MAX_KEEP_FOR_DEBUG_HOURS", 24, minimum=1)
# A run whose trainer finished without its final adapters in the store fails and keeps its box this long.
RUN_KEEP_BOX_ON_LOST_OUTPUTS_H = env_int("RUN_KEEP_BOX_ON_LOST_OUTPUTS_H", 4, minimum=0)
# A phase's data file (an upload or an s3:// object), and one record of it: larger ones are refused before they are
# copied or read into memory.
DATASET_MAX_BYTES = env_int("DATASET_MAX_BYTES", 10 * 1024**3, minimum=1)
DATASET_MAX_LINE_BYTES = env_int("DATASET_MAX_LINE_BYTES", 16 * 1024**2, minimum=1024)
# A requested rent no worker attempted within RENT_QUEUE_GRACE_S (its task lost) is rented by a sweep that runs that
# often, or given up on with its reason once it has waited RENT_QUEUE_MAX_WAIT_S (the offer may be gone by then).
RENT_QUEUE_GRACE_S = env_int("RENT_QUEUE_GRACE_S", 60, minimum=5)
RENT_QUEUE_MAX_WAIT_S = env_int("RENT_QUEUE_MAX_WAIT_S", 1800, minimum=RENT_QUEUE_GRACE_S)
CELERY_BEAT_SCHEDULE.update({
    "sync-instances": {"task": "fleet.tasks.sync_instances", "schedule": float(INSTANCE_SYNC_SECONDS)},
    "reconcile-charges": {"task": "fleet.tasks.reconcile_charges", "schedule": float(CHARGES_RECONCILE_SECONDS)},
    "rent-waiting-instances": {"task": "fleet.tasks.rent_waiting_instances", "schedule": float(RENT_QUEUE_GRACE_S)},
})

# The reaper
REAPER_SECONDS = env_int("REAPER_SECONDS", 60, minimum=5)
REAPER_DRY_RUN = env_bool("REAPER_DRY_RUN", False)
REAPER_MAX_AGE_HOURS = env_float("REAPER_MAX_AGE_HOURS", 12.0, minimum=0.1)
REAPER_IDLE_GRACE_MIN = env_float("REAPER_IDLE_GRACE_MIN", 30.0, minimum=1)
REAPER_BOOT_TIMEOUT_MIN = env_float("REAPER_BOOT_TIMEOUT_MIN", 60.0, minimum=1)  # never running this long: destroyed
REAPER_PROBE_FAILURES = env_int("REAPER_PROBE_FAILURES", 3, minimum=1)
REAPER_GPU_UNRESPONSIVE_MIN = env_float("REAPER_GPU_UNRESPONSIVE_MIN", 5.0, minimum=1)
REAPER_NO_PROGRESS_MIN = env_float("REAPER_NO_PROGRESS_MIN", 30.0, minimum=1)
SPEND_CAP_USD_PER_HOUR = env_decimal("SPEND_CAP_USD_PER_HOUR", Decimal("12"))  # 0 turns the cap off
# A machine of ours whose price the provider does not give (adopted by its label) is counted at this until it does.
UNKNOWN_PRICE_USD_PER_HOUR = env_decimal("UNKNOWN_PRICE_USD_PER_HOUR", Decimal("8"))
CELERY_BEAT_SCHEDULE.update(
    {"reap-instances": {"task": "fleet.tasks.reap_instances", "schedule": float(REAPER_SECONDS)}})

# Webhook alerts
WEBHOOK_TIMEOUT_S = env_float("WEBHOOK_TIMEOUT_S", 15.0, minimum=0.01)  # the whole attempt, not each read
WEBHOOK_ALLOW_PRIVATE_ADDRESSES = env_bool("WEBHOOK_ALLOW_PRIVATE_ADDRESSES", False)  # a private network only
WEBHOOK_MAX_ATTEMPTS = env_int("WEBHOOK_MAX_ATTEMPTS", 6, minimum=1)
WEBHOOK_BACKOFF_BASE_S = env_float("WEBHOOK_BACKOFF_BASE_S", 10.0, minimum=0.001)
WEBHOOK_BACKOFF_FACTOR = env_float("WEBHOOK_BACKOFF_FACTOR", 2.0, minimum=1.0)
WEBHOOK_BACKOFF_MAX_S = env_float("WEBHOOK_BACKOFF_MAX_S", 3600.0, minimum=0.001)
WEBHOOK_RETRY_SECONDS = env_int("WEBHOOK_RETRY_SECONDS", 60, minimum=5)  # beat: picks up deliveries whose task was lost
CELERY_BEAT_SCHEDULE.update(
    {"retry-webhooks": {"task": "fleet.tasks.retry_webhooks", "schedule": float(WEBHOOK_RETRY_SECONDS)}})
# Redis hands an unacknowledged message (late acks) to another worker after its visibility timeout, counted from
# when it was sent: it must outlast the longest countdown a task is queued with (a webhook's backoff) plus the
# longest a task may run (TASK_TIME_LIMIT_MAX_S, every task's hard limit is within it), or the message runs
# twice. A worker lost mid-task is therefore redelivered only after that long; periodic tasks are re-sent by beat.
TASK_TIME_LIMIT_MAX_S = 600
if REDIS_URL:
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "visibility_timeout": int(WEBHOOK_BACKOFF_MAX_S) + TASK_TIME_LIMIT_MAX_S + 600,
        "socket_connect_timeout": 5,
    }

# The inference fleet: probes of every serving box's /v1/models, and replicas kept at each model's desired count
PROBE_SECONDS = env_int("PROBE_SECONDS", 30, minimum=5)
PROBE_TIMEOUT_S = env_float("PROBE_TIMEOUT_S", 5.0, minimum=0.1)  # one probe, connect to last byte
PROBE_CONCURRENCY = env_int("PROBE_CONCURRENCY", 256, minimum=1)
PROBE_STARTUP_GRACE_S = env_int("PROBE_STARTUP_GRACE_S", 1800, minimum=0)  # failures before vLLM ever answered
# Tests and labs only; on by default with the embedded simulated marketplace, whose serving boxes run on this machine.
PROBE_ALLOW_PRIVATE_ADDRESSES = env_bool("PROBE_ALLOW_PRIVATE_ADDRESSES", EMBEDDED and SIMULATOR_ENABLED)
INFERENCE_FLEET_SECONDS = env_int("INFERENCE_FLEET_SECONDS", 60, minimum=5)
CELERY_BEAT_SCHEDULE.update({
    "probe-serving-instances": {"task": "fleet.tasks.probe_serving_instances", "schedule": float(PROBE_SECONDS)},
    "maintain-inference-fleet": {"task": "fleet.tasks.maintain_inference_fleet",
                                 "schedule": float(INFERENCE_FLEET_SECONDS)},
})

# Runs: the agent API and checkpoint storage
S3_ENDPOINT_URL = env_str("S3_ENDPOINT_URL", "")
S3_REGION = env_str("S3_REGION", "")
S3_ACCESS_KEY = env_str("S3_ACCESS_KEY", "")
S3_SECRET_KEY = env_str("S3_SECRET_KEY", "")
# A folder on the dashboard's machine as a run's bucket: only where its boxes run on this machine too (the simulated
# marketplace's). A rented box cannot write there, so its checkpoints and adapter would be lost with every GPU hour.
LOCAL_BUCKETS = env_bool("LOCAL_BUCKETS", SIMULATOR_ENABLED)
# How rented boxes reach the agent API; on the embedded default, the address `manage.py up` serves on.
DASHBOARD_URL = env_str("DASHBOARD_URL", f"http://127.0.0.1:{env_int('PORT', 8000, minimum=1)}")
AGENT_HEARTBEAT_TIMEOUT_S = env_int("AGENT_HEARTBEAT_TIMEOUT_S", 60, minimum=5)  # silent longer: host lost
AGENT_DEAD_MAN_WINDOW_S = env_int("AGENT_DEAD_MAN_WINDOW_S", 3 * 3600, minimum=60)  # unrenewed longer: box stops
# Read grants (data, model, the checkpoint resumed from, a serving box's adapter) last this long: a model's download
# may take over half an hour, and a presigned GET is checked when each file's download starts.
STORAGE_GRANT_S = env_int("STORAGE_GRANT_S", 3600, minimum=60, maximum=12 * 3600)
# The Hugging Face hub the dashboard reads a hub model's manifest from (its LFS files' sha256), with HF_TOKEN when set
# (a gated or private model); empty: huggingface.co.
HF_ENDPOINT = env_str("HF_ENDPOINT", "")
# Upload grants are short and renewed only with a live token: a replaced or ended box can write into its own
# attempt's folder (which no other attempt reads) until its last grant runs out, never for longer than an hour.
STORAGE_UPLOAD_GRANT_S = env_int("STORAGE_UPLOAD_GRANT_S", 900, minimum=60, maximum=3600)
RUN_INSTALL_TIMEOUT_S = env_int("RUN_INSTALL_TIMEOUT_S", 1800, minimum=60)
# A box that trains no first step this long after it was rented, its GPU idle, is hung (a trainer stuck loading or
# in NCCL's start): its heartbeats alone are no progress. Longer than the no-progress rule, for the downloads.
RUN_FIRST_STEP_TIMEOUT_MIN = env_float("RUN_FIRST_STEP_TIMEOUT_MIN", 120.0, minimum=5)
# A run that no offer fits this long (its filters, its bad hosts) fails with the reason rather than wait for good.
RUN_NO_OFFER_TIMEOUT_H = env_float("RUN_NO_OFFER_TIMEOUT_H", 24.0, minimum=0.1)
SUPERVISOR_SECONDS = env_int("SUPERVISOR_SECONDS", 10, minimum=1)
# A box whose heartbeat finds the supervisor silent this long stops its own machine (nothing would reap it).
SUPERVISOR_STALE_S = env_int("SUPERVISOR_STALE_S", 1800, minimum=60)
AGENT_MAX_METRIC_POINTS = env_int("AGENT_MAX_METRIC_POINTS", 2000, minimum=1)
AGENT_MAX_LOG_EVENTS_PER_HOUR = env_int("AGENT_MAX_LOG_EVENTS_PER_HOUR", 600, minimum=1)  # a run's, past: dropped
CELERY_BEAT_SCHEDULE.update({"supervise-runs": {"task": "runs.tasks.supervise_runs",
                                                "schedule": float(SUPERVISOR_SECONDS)}})

# Run pages and the Prometheus exposition: /metrics answers only `Authorization: Bearer <METRICS_TOKEN>`; unset: off
METRICS_TOKEN = env_str("METRICS_TOKEN", "")

# How a rented box gets the trainer: "image" rents WORKER_IMAGE, whose entry point is the agent; "onstart" rents a
# marketplace's stock PyTorch image (WORKER_STOCK_IMAGE, with the same CUDA as WORKER_IMAGE_CUDA) and bootstraps it
# with docker/onstart.sh, which installs TRAINING_PACKAGE, proves it with the probe and starts the agent.
WORKER_BOOTSTRAP = env_str("WORKER_BOOTSTRAP", "image")
WORKER_STOCK_IMAGE = env_str("WORKER_STOCK_IMAGE", "")
TRAINING_PACKAGE = env_str("TRAINING_PACKAGE", "")
if WORKER_BOOTSTRAP not in ("image", "onstart"):
    raise ImproperlyConfigured(f"WORKER_BOOTSTRAP={WORKER_BOOTSTRAP!r} is not 'image' or 'onstart'.")
if WORKER_BOOTSTRAP == "onstart" and not (WORKER_STOCK_IMAGE and TRAINING_PACKAGE):
    raise ImproperlyConfigured("WORKER_BOOTSTRAP=onstart needs WORKER_STOCK_IMAGE and TRAINING_PACKAGE.")
