"""Fairlane settings: every value comes from the environment, with the default documented here
and in the README's configuration table.

Two ways to run share this file: embedded (no DATABASE_URL / REDIS_URL: a SQLite file, an
in-process channel layer and counters) and distributed (PostgreSQL and Redis).
"""

import os
import secrets
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    if value.lower() in {"1", "true", "yes", "on"}:
        return True
    if value.lower() in {"0", "false", "no", "off"}:
        return False
    raise ImproperlyConfigured(f"{name} must be a boolean (1/0, true/false), got {value!r}")


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be an integer, got {value!r}") from None


def env_list(name: str, default: str) -> list[str]:
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


DATA_DIR = Path(os.environ.get("FAIRLANE_DATA_DIR", BASE_DIR / "var")).resolve()
DEBUG = env_bool("DEBUG", False)


def _secret_key() -> str:
    """SECRET_KEY from the environment, else one generated once and kept in DATA_DIR so that
    sessions (and the API-key pepper derived from it) survive restarts of the embedded mode."""
    if key := os.environ.get("SECRET_KEY"):
        return key
    path = DATA_DIR / "secret_key"
    if path.exists():
        return path.read_text().strip()
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    key = secrets.token_urlsafe(50)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(key)
    return key


SECRET_KEY = _secret_key()
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", "127.0.0.1,localhost,[::1]")
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", "")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "django_prometheus",
    "django_htmx",
    "csp",
    "tenants",
    "routing",
    "workers",
]

MIDDLEWARE = [
    "django_prometheus.middleware.PrometheusBeforeMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "middleware.StaticFilesMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "csp.middleware.CSPMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "django_prometheus.middleware.PrometheusAfterMiddleware",
]

ROOT_URLCONF = "urls"
ASGI_APPLICATION = "asgi.application"
WSGI_APPLICATION = "wsgi.application"

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
            "libraries": {"portal": "tenants.portal.templatetags"},
        },
    },
]

# --- database ---------------------------------------------------------------------------
DATABASE_URL = os.environ.get("DATABASE_URL") or f"sqlite:///{DATA_DIR / 'fairlane.sqlite3'}"
if DATABASE_URL.startswith("sqlite"):
    DATA_DIR.mkdir(parents=True, exist_ok=True)
DATABASES = {"default": dj_database_url.parse(DATABASE_URL)}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    DATABASES["default"]["OPTIONS"] = {
        # IMMEDIATE takes the write lock when a transaction starts, so two budget reservations
        # queue instead of failing with "database is locked" when both upgrade to writers.
        "transaction_mode": "IMMEDIATE",
        "timeout": 20,
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
else:
    DATABASES["default"]["ENGINE"] = "pgpool"  # django-prometheus's, with a pool that heals
    # A bounded pool per process: Django's ASGI handler gives each request a thread of its
    # own, so without it 500 concurrent requests would open 500 connections (PostgreSQL's
    # default limit is 100). A request waits for a free connection instead.
    # FAIRLANE_DB_POOL_SIZE=0: a connection per thread, no pool.
    if env_int("FAIRLANE_DB_POOL_SIZE", 16):
        DATABASES["default"]["OPTIONS"] = {"pool": {
            "min_size": 1, "max_size": env_int("FAIRLANE_DB_POOL_SIZE", 16),
            "timeout": float(os.environ.get("FAIRLANE_DB_POOL_TIMEOUT_SECONDS", "30"))}}
    # A connection the server ended (a restart, pg_terminate_backend, a proxy's idle cut) is
    # noticed and replaced before a request gets it (the pool's check; without a pool, before
    # a persistent connection is reused); one found dead has the pool check all its idle
    # connections at once (platform/pgpool): it heals itself.
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- redis: channel layer, counters, Celery -------------------------------------------------
REDIS_URL = os.environ.get("REDIS_URL", "")
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [REDIS_URL]},
        }
    }
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache",
                          "LOCATION": REDIS_URL}}
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL") or REDIS_URL or "memory://"
CELERY_RESULT_BACKEND = os.environ.get("CELERY_RESULT_BACKEND") or REDIS_URL or None
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# Workers log through LOGGING below (each line with its request's trace id), not Celery's own.
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_TASK_DEFAULT_QUEUE = "default"
CELERY_BEAT_SCHEDULE = {
    "budget-reservations-expire": {
        "task": "tenants.tasks.budget_reservations_expire",
        "schedule": 60.0,
    },
    "settlements-drain": {
        "task": "workers.tasks.settlements_drain",
        "schedule": 30.0,
    },
    "backends-probe": {
        "task": "routing.tasks.backends_probe",
        "schedule": float(os.environ.get("FAIRLANE_HEALTH_INTERVAL_SECONDS", "15")),
    },
    "budget-alerts-sweep": {
        "task": "tenants.tasks.budget_alerts_sweep",
        "schedule": float(os.environ.get("FAIRLANE_ALERT_SWEEP_SECONDS", "60")),
    },
}

# --- auth, sessions, security ------------------------------------------------------------
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "/portal/login/"
LOGIN_REDIRECT_URL = "/portal/"
LOGOUT_REDIRECT_URL = "/portal/login/"
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
SESSION_COOKIE_SECURE = env_bool("SECURE_COOKIES", False)
CSRF_COOKIE_SAMESITE = "Lax"
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"
# No inline script anywhere (the pages' JS is in static files); connect-src 'self' covers the
# same-origin websocket. Swagger UI's page (drf-spectacular) has an inline script: excluded.
CONTENT_SECURITY_POLICY = {
    "EXCLUDE_URL_PREFIXES": ["/api/docs/"],
    "DIRECTIVES": {
        "default-src": ["'self'"], "script-src": ["'self'"], "style-src": ["'self'"],
        "img-src": ["'self'", "data:"], "connect-src": ["'self'"], "object-src": ["'none'"],
        "base-uri": ["'self'"], "form-action": ["'self'"], "frame-ancestors": ["'none'"],
    },
}
# Password reset mails: the console in development, SMTP (EMAIL_HOST...) when configured.
EMAIL_BACKEND = os.environ.get("EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend")
EMAIL_HOST = os.environ.get("EMAIL_HOST", "localhost")
EMAIL_PORT = env_int("EMAIL_PORT", 25)
EMAIL_HOST_USER = os.environ.get("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = os.environ.get("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)
DEFAULT_FROM_EMAIL = os.environ.get("DEFAULT_FROM_EMAIL", "fairlane@localhost")
# Portal sign-in throttle: after this many failed sign-ins for one username (or from one
# address) within the window, further attempts are refused until it passes.
FAIRLANE_LOGIN_MAX_FAILURES = env_int("FAIRLANE_LOGIN_MAX_FAILURES", 5)
FAIRLANE_LOGIN_WINDOW_SECONDS = env_int("FAIRLANE_LOGIN_WINDOW_SECONDS", 900)
# Lifetime of the key the playground page mints for itself (held in the page's memory only).
FAIRLANE_PLAYGROUND_KEY_SECONDS = env_int("FAIRLANE_PLAYGROUND_KEY_SECONDS", 3600)

# --- i18n, static --------------------------------------------------------------------------
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
STATIC_ROOT = Path(os.environ.get("STATIC_ROOT", BASE_DIR / "staticfiles"))
STATICFILES_DIRS = [BASE_DIR / "static"]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}

# --- REST framework and the OpenAPI schema ---------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "tenants.apis.auth.ApiKeyAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.LimitOffsetPagination",
    "PAGE_SIZE": 50,
    # drf-spectacular's, with every operation's error responses in the OpenAI shape.
    "DEFAULT_SCHEMA_CLASS": "tenants.apis.schema.FairlaneAutoSchema",
    "EXCEPTION_HANDLER": "tenants.apis.errors.exception_handler",
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}
if DEBUG:
    REST_FRAMEWORK["DEFAULT_RENDERER_CLASSES"].append("rest_framework.renderers.BrowsableAPIRenderer")
SPECTACULAR_SETTINGS = {
    "TITLE": "Fairlane management API",
    "DESCRIPTION": "Tenants, members, agents, API keys, budgets and usage.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    # PATCH bodies are validated as written (optional fields say required=False): no
    # "Patched" copies with every field optional.
    "COMPONENT_SPLIT_PATCH": False,
    "ENUM_NAME_OVERRIDES": {"LaneEnum": "tenants.models.Lane"},
}

# --- Fairlane ------------------------------------------------------------------------------
# Keyed hash for API keys. Defaults to SECRET_KEY; set it separately to rotate SECRET_KEY
# without invalidating every issued key.
FAIRLANE_API_KEY_PEPPER = os.environ.get("FAIRLANE_API_KEY_PEPPER") or SECRET_KEY
# A reservation that is neither settled nor released within this many seconds is released
# by the beat task (a crashed API process must not hold budget forever).
FAIRLANE_RESERVATION_TTL_SECONDS = env_int("FAIRLANE_RESERVATION_TTL_SECONDS", 900)
# How often last_used_at is written for a key (seconds): one write per key per interval,
# not one per request.
FAIRLANE_KEY_LAST_USED_RESOLUTION_SECONDS = env_int("FAIRLANE_KEY_LAST_USED_RESOLUTION_SECONDS", 60)
# How long a process may keep an API key, its tenant and agent, and budgets without reading
# them again (tenants/cache.py). Changes reach every process at once through Redis; this is
# the bound when Redis could not tell them. 0 turns the cache off.
FAIRLANE_AUTH_CACHE_SECONDS = float(os.environ.get("FAIRLANE_AUTH_CACHE_SECONDS", "30"))
# Optional bearer token required to scrape /metrics.
FAIRLANE_METRICS_TOKEN = os.environ.get("FAIRLANE_METRICS_TOKEN", "")
# Whether any signed-in user may create a tenant through the API (they become its owner).
FAIRLANE_SELF_SERVICE_TENANTS = env_bool("FAIRLANE_SELF_SERVICE_TENANTS", True)
# --- budget alerts and the ops dashboard ----------------------------------------------------
# Webhook URLs resolving to loopback, private, link-local... addresses are refused (SSRF)
# unless this is set (e.g. a receiver inside the cluster).
FAIRLANE_ALERT_WEBHOOK_ALLOW_PRIVATE = env_bool("FAIRLANE_ALERT_WEBHOOK_ALLOW_PRIVATE", False)
# A failed delivery is retried after this many seconds, doubling (at most an hour), until it
# has been attempted this many times.
FAIRLANE_ALERT_RETRY_BASE_SECONDS = float(os.environ.get("FAIRLANE_ALERT_RETRY_BASE_SECONDS",
                                                         "10"))
FAIRLANE_ALERT_DELIVERY_ATTEMPTS = env_int("FAIRLANE_ALERT_DELIVERY_ATTEMPTS", 8)
# How often forecasts are evaluated (the beat; the embedded server's own thread).
FAIRLANE_ALERT_SWEEP_SECONDS = float(os.environ.get("FAIRLANE_ALERT_SWEEP_SECONDS", "60"))
# How often the ops dashboard's live panels refresh themselves.
FAIRLANE_OPS_POLL_SECONDS = env_int("FAIRLANE_OPS_POLL_SECONDS", 5)
# Traces: every request carries a W3C trace id (its `traceparent`, or a new one) into its logs,
# job and ledger row. "otlp" also sends OpenTelemetry spans over OTLP/HTTP to
# OTEL_EXPORTER_OTLP_ENDPOINT (the SDK's own variables apply); "off" sends nothing.
FAIRLANE_TRACING = os.environ.get("FAIRLANE_TRACING", "off")
if FAIRLANE_TRACING not in ("off", "otlp"):
    raise ImproperlyConfigured("FAIRLANE_TRACING must be 'off' or 'otlp'")

# --- serving ----------------------------------------------------------------------------------
# embedded: engines run in the API process (a thread pool); distributed: on GPU workers that
# take requests from the Redis fair queue (workers/modes.py). "celery", its former name (it
# runs no Celery task per request), is still accepted.
FAIRLANE_ENGINE_MODE = os.environ.get("FAIRLANE_ENGINE_MODE") or ("distributed" if REDIS_URL
                                                                  else "embedded")
if FAIRLANE_ENGINE_MODE == "celery":
    FAIRLANE_ENGINE_MODE = "distributed"
if FAIRLANE_ENGINE_MODE not in {"embedded", "distributed"}:
    raise ImproperlyConfigured("FAIRLANE_ENGINE_MODE must be 'embedded' or 'distributed'")
FAIRLANE_GPU_QUEUE = os.environ.get("FAIRLANE_GPU_QUEUE", "gpu")
# Where presets are generated and model directories live.
FAIRLANE_MODEL_DIR = Path(os.environ.get("FAIRLANE_MODEL_DIR", DATA_DIR / "models"))
# --- model provenance (workers/artifacts) ---------------------------------------------------
# require: a model loads only with a manifest signed by a trusted key; warn: an unsigned model,
# or one signed by a key not trusted here, loads with a warning. Integrity (hashes, extra or
# missing files, links, pickles) is enforced under both. Distributed deployments require.
FAIRLANE_MODEL_SIGNATURES = os.environ.get("FAIRLANE_MODEL_SIGNATURES") or (
    "warn" if FAIRLANE_ENGINE_MODE == "embedded" else "require")
if FAIRLANE_MODEL_SIGNATURES not in {"require", "warn"}:
    raise ImproperlyConfigured("FAIRLANE_MODEL_SIGNATURES must be 'require' or 'warn'")
# Trusted public keys, comma-separated: `ed25519:<base64>` or paths of PEM files.
FAIRLANE_TRUSTED_KEYS = env_list("FAIRLANE_TRUSTED_KEYS", "")
# The local development key that signs presets and trained models when they are created (and
# is trusted here); `make run` creates it once. Empty: none (production).
FAIRLANE_DEV_SIGNING_KEY = os.environ.get("FAIRLANE_DEV_SIGNING_KEY",
                                          str(DATA_DIR / "signing" / "dev-ed25519.pem"))
# Models a GPU worker loads at start (comma-separated names; empty: every enabled model).
FAIRLANE_WORKER_MODELS = env_list("FAIRLANE_WORKER_MODELS", "")
FAIRLANE_ENGINE_DEVICE = os.environ.get("FAIRLANE_ENGINE_DEVICE", "cpu")
FAIRLANE_ENGINE_KV_CACHE_MB = env_int("FAIRLANE_ENGINE_KV_CACHE_MB", 256)
FAIRLANE_ENGINE_MAX_NUM_SEQS = env_int("FAIRLANE_ENGINE_MAX_NUM_SEQS", 64)
FAIRLANE_ENGINE_THREADS = env_int("FAIRLANE_ENGINE_THREADS", 0) or None
# Cap on any model's context (0: the checkpoint's own).
FAIRLANE_MAX_MODEL_LEN = env_int("FAIRLANE_MAX_MODEL_LEN", 0) or None
FAIRLANE_HEARTBEAT_SECONDS = env_int("FAIRLANE_HEARTBEAT_SECONDS", 2)
# --- models on vLLM (runtime "vllm": a `vllm serve` child process of the worker) -------------
# The command (split like a shell would); the model directory and our flags are appended.
FAIRLANE_VLLM_COMMAND = os.environ.get("FAIRLANE_VLLM_COMMAND") or "vllm serve"
# Further flags for every vLLM child (e.g. "--gpu-memory-utilization 0.85 --tensor-parallel-size 2").
FAIRLANE_VLLM_ARGS = os.environ.get("FAIRLANE_VLLM_ARGS", "")
# How long a child may take to answer /health after it is started (loading, compiling).
FAIRLANE_VLLM_START_TIMEOUT_SECONDS = env_int("FAIRLANE_VLLM_START_TIMEOUT_SECONDS", 900)
# How often a running child's /health and /metrics are read.
FAIRLANE_VLLM_HEALTH_SECONDS = float(os.environ.get("FAIRLANE_VLLM_HEALTH_SECONDS", "2"))
# --- fair queue -----------------------------------------------------------------------------
# A taken request's lease; the worker's heartbeat renews it. Lapsed: the worker died, and the
# request goes back to the head of its tenant's queue.
FAIRLANE_LEASE_SECONDS = env_int("FAIRLANE_LEASE_SECONDS", 10)
# Prefix of the queues' Redis keys, to run separate deployments (or test runs) on one Redis.
FAIRLANE_QUEUE_NAMESPACE = os.environ.get("FAIRLANE_QUEUE_NAMESPACE", "")
# Minimum shares of recent dispatches for the lower lanes while higher lanes are backlogged.
FAIRLANE_MIN_SHARE_STANDARD = float(os.environ.get("FAIRLANE_MIN_SHARE_STANDARD", "0.10"))
FAIRLANE_MIN_SHARE_BULK = float(os.environ.get("FAIRLANE_MIN_SHARE_BULK", "0.05"))
# Requests a GPU worker runs at once (its runner threads); its engine batches them all.
FAIRLANE_WORKER_CONCURRENCY = env_int("FAIRLANE_WORKER_CONCURRENCY", 64)
# A worker's last free sequence slots take realtime requests only.
FAIRLANE_REALTIME_RESERVED_SLOTS = env_int("FAIRLANE_REALTIME_RESERVED_SLOTS", 2)
# How often an idle or full worker looks at the queue again.
FAIRLANE_PULL_INTERVAL_SECONDS = float(os.environ.get("FAIRLANE_PULL_INTERVAL_SECONDS", "0.05"))
# Admission control: requests waiting per tenant (beyond: 429) and per lane (beyond: 503).
FAIRLANE_MAX_QUEUE_PER_TENANT = env_int("FAIRLANE_MAX_QUEUE_PER_TENANT", 256)
FAIRLANE_MAX_QUEUE_PER_LANE = env_int("FAIRLANE_MAX_QUEUE_PER_LANE", 2048)
# Brownout, by queued requests / FAIRLANE_MAX_QUEUE_PER_LANE: shed the bulk lane from the
# first fraction, also cap standard max_tokens (to the given count) from the second.
FAIRLANE_BROWNOUT_SHED_AT = float(os.environ.get("FAIRLANE_BROWNOUT_SHED_AT", "0.5"))
FAIRLANE_BROWNOUT_CAP_AT = float(os.environ.get("FAIRLANE_BROWNOUT_CAP_AT", "0.75"))
FAIRLANE_BROWNOUT_MAX_TOKENS = env_int("FAIRLANE_BROWNOUT_MAX_TOKENS", 256)
# Warm shutdown lets running requests finish for up to this long.
FAIRLANE_DRAIN_TIMEOUT_SECONDS = env_int("FAIRLANE_DRAIN_TIMEOUT_SECONDS", 300)
FAIRLANE_HEARTBEAT_TTL_SECONDS = env_int("FAIRLANE_HEARTBEAT_TTL_SECONDS", 10)
# The API gives up on a request (504, or an error event) when no worker started it within the
# first timeout, or a started one went silent for the idle timeout.
FAIRLANE_FIRST_EVENT_TIMEOUT_SECONDS = env_int("FAIRLANE_FIRST_EVENT_TIMEOUT_SECONDS", 300)
FAIRLANE_STREAM_IDLE_TIMEOUT_SECONDS = env_int("FAIRLANE_STREAM_IDLE_TIMEOUT_SECONDS", 60)
# Settlements the ledger could not take (the database was unreachable) wait in an outbox and
# are retried this often: a Redis stream where there is Redis, else files in this directory.
FAIRLANE_SETTLEMENT_DIR = Path(os.environ.get("FAIRLANE_SETTLEMENT_DIR",
                                              DATA_DIR / "settlements"))
FAIRLANE_SETTLEMENT_RETRY_SECONDS = float(
    os.environ.get("FAIRLANE_SETTLEMENT_RETRY_SECONDS", "2"))

# --- routing ----------------------------------------------------------------------------------
# Key that provider credentials are encrypted under in the database (default: SECRET_KEY).
FAIRLANE_CREDENTIALS_KEY = os.environ.get("FAIRLANE_CREDENTIALS_KEY") or SECRET_KEY
# Health beat: how often each backend is probed, and when a backend with no successful probe
# for that long is stale; after FAIRLANE_HEALTH_OFFLINE_AFTER failed probes in a row, offline.
FAIRLANE_HEALTH_INTERVAL_SECONDS = env_int("FAIRLANE_HEALTH_INTERVAL_SECONDS", 15)
FAIRLANE_HEALTH_STALE_SECONDS = env_int("FAIRLANE_HEALTH_STALE_SECONDS", 60)
FAIRLANE_HEALTH_OFFLINE_AFTER = env_int("FAIRLANE_HEALTH_OFFLINE_AFTER", 3)
# Circuit breaker per backend (per API process): open after this many failures in a row, or
# at this failure ratio over the window once it has the minimum requests; after the cooldown
# one trial request (half-open) decides whether it closes again.
FAIRLANE_BREAKER_FAILURES = env_int("FAIRLANE_BREAKER_FAILURES", 5)
FAIRLANE_BREAKER_RATIO = float(os.environ.get("FAIRLANE_BREAKER_RATIO", "0.5"))
FAIRLANE_BREAKER_MIN_REQUESTS = env_int("FAIRLANE_BREAKER_MIN_REQUESTS", 20)
FAIRLANE_BREAKER_WINDOW_SECONDS = env_int("FAIRLANE_BREAKER_WINDOW_SECONDS", 30)
FAIRLANE_BREAKER_COOLDOWN_SECONDS = float(os.environ.get("FAIRLANE_BREAKER_COOLDOWN_SECONDS", "30"))
# Retries when every backend in the chain failed before its first token: how many rounds,
# the longest Retry-After worth waiting for (longer: answer 503 with that Retry-After), and the
# base of the jittered exponential backoff after failures that named no wait.
FAIRLANE_RETRIES = env_int("FAIRLANE_RETRIES", 2)
FAIRLANE_RETRY_MAX_WAIT_SECONDS = float(os.environ.get("FAIRLANE_RETRY_MAX_WAIT_SECONDS", "10"))
FAIRLANE_RETRY_BACKOFF_SECONDS = float(os.environ.get("FAIRLANE_RETRY_BACKOFF_SECONDS", "0.5"))
# max_tokens sent to a remote backend when the request sets none and the backend's context
# length is not configured (the budget reserves for it, so it is never left open-ended).
FAIRLANE_DEFAULT_MAX_TOKENS = env_int("FAIRLANE_DEFAULT_MAX_TOKENS", 4096)
# Images in chat requests: what one counts for a budget hold (and when a provider reports no
# usage): above GPT-4o's 1,105 and Claude's ~1,600 at their largest; raise it for models that
# bill images as many more tokens (gpt-4o-mini: up to ~37,000).
FAIRLANE_IMAGE_WORST_TOKENS = env_int("FAIRLANE_IMAGE_WORST_TOKENS", 2500)
# Anthropic takes images as bytes: an http(s) image is fetched by the API process, within
# these limits (Anthropic's own is 5 MB), and never from private, loopback or link-local
# addresses unless FAIRLANE_IMAGE_FETCH_ALLOW_PRIVATE is set (tests; a trusted network).
FAIRLANE_IMAGE_MAX_BYTES = env_int("FAIRLANE_IMAGE_MAX_BYTES", 5 * 1024 * 1024)
FAIRLANE_IMAGE_FETCH_TIMEOUT_SECONDS = float(
    os.environ.get("FAIRLANE_IMAGE_FETCH_TIMEOUT_SECONDS", "10"))
FAIRLANE_IMAGE_FETCH_ALLOW_PRIVATE = env_bool("FAIRLANE_IMAGE_FETCH_ALLOW_PRIVATE", False)
# How long a request waits in a scarce backend's lease queue before falling through.
FAIRLANE_LEASE_WAIT_SECONDS = float(os.environ.get("FAIRLANE_LEASE_WAIT_SECONDS", "5"))
# How long the registry read by the router is reused before it is read again (seconds).
FAIRLANE_ROUTING_CACHE_SECONDS = float(os.environ.get("FAIRLANE_ROUTING_CACHE_SECONDS", "2"))

# /metrics adds up every process of a deployment when PROMETHEUS_MULTIPROC_DIR is set: the
# directory is emptied when the deployment starts (platform/metrics_export.py).
from metrics_export import multiproc_dir_prepare  # noqa: E402

multiproc_dir_prepare()

LOG_LEVEL = os.environ.get("LOG_LEVEL", "INFO")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    # Each line names the request it is about: its trace id and request id ("-" outside one).
    "filters": {"trace": {"()": "workers.trace.TraceLogFilter"}},
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s "
                                       "[trace=%(trace_id)s request=%(request_id)s] %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain",
                             "filters": ["trace"]}},
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
}
