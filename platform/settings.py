"""Fairlane settings: every value comes from the environment, with the default documented here
and in docs/configuration.md.

Two ways to run share this file: embedded (no DATABASE_URL / REDIS_URL: a SQLite file, an
in-process channel layer and counters) and distributed (PostgreSQL and Redis). Fairlane's own
settings (FAIRLANE_*) are in fairlane_settings.py; environment.py reads the environment.
"""

import os
from pathlib import Path
from typing import Any

import dj_database_url
from celery.schedules import crontab

from environment import BASE_DIR, DATA_DIR, REDIS_URL, env_bool, env_int, env_list

DEBUG = env_bool("DEBUG", False)
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", "127.0.0.1,localhost,[::1]")
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", "")

INSTALLED_APPS = [
    "tenants.apps.AdminConfig",  # django.contrib.admin, its sign-in throttled
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
    "middleware.RuntimeMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # The audit context (who, request id, trace id, address) and signed-out sessions' end,
    # for the site; /v1 passes straight through.
    "tenants.middleware.GovernanceMiddleware",
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
    options = DATABASES["default"].setdefault("OPTIONS", {})
    if env_int("FAIRLANE_DB_POOL_SIZE", 16):
        options["pool"] = {
            "min_size": 1,
            "max_size": env_int("FAIRLANE_DB_POOL_SIZE", 16),
            "timeout": float(os.environ.get("FAIRLANE_DB_POOL_TIMEOUT_SECONDS", "30")),
        }
    # Django turns psycopg's prepared statements off (prepare_threshold None) for poolers; a
    # threshold lets the budget statements, on psycopg's own cursors, be prepared (see
    # FAIRLANE_DB_PREPARE). Django's client-side-binding cursors never prepare, so nothing
    # else changes.
    if env_bool("FAIRLANE_DB_PREPARE", True):
        options["prepare_threshold"] = 5
    # A connection the server ended (a restart, pg_terminate_backend, a proxy's idle cut) is
    # noticed and replaced before a request gets it (the pool's check; without a pool, before
    # a persistent connection is reused); one found dead has the pool check all its idle
    # connections at once (platform/pgpool): it heals itself.
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- redis: channel layer, counters, Celery -------------------------------------------------
# Deployments sharing a Redis under FAIRLANE_QUEUE_NAMESPACE (fairlane_settings.py) keep their
# channel groups, cache entries (the sign-in lockouts) and Celery queues apart too.
_NAMESPACE = os.environ.get("FAIRLANE_QUEUE_NAMESPACE", "")
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [REDIS_URL], "prefix": _NAMESPACE + "asgi"},
        }
    }
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": _NAMESPACE,
        }
    }
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
# On a Redis broker, kombu prefixes every key it uses (the queues' lists, the unacked sets,
# the broadcast channels) with the namespace, so one deployment's worker never takes another's
# tasks (its periodic housekeeping ran against the wrong database). Queue names stay as they
# are (`-Q gpu,default`).
if _NAMESPACE and CELERY_BROKER_URL.startswith(("redis", "rediss")):
    CELERY_BROKER_TRANSPORT_OPTIONS = {"global_keyprefix": _NAMESPACE}
CELERY_BEAT_SCHEDULE = {
    "budget-reservations-expire": {
        "task": "tenants.tasks.budget_reservations_expire",
        "schedule": 60.0,
    },
    "settlements-retry": {
        "task": "workers.tasks.settlements_retry",
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
    "audit-checkpoint": {
        "task": "workers.tasks.audit_checkpoint",
        "schedule": float(os.environ.get("FAIRLANE_AUDIT_CHECKPOINT_SECONDS", "3600")),
    },
    # Nightly, at an hour of little traffic: it locks each window for a moment.
    "budget-windows-reconcile": {
        "task": "tenants.tasks.budget_windows_reconcile",
        "schedule": crontab(hour=3, minute=30),
    },
    "audit-retention": {
        "task": "tenants.tasks.audit_retention",
        "schedule": 86400.0,
    },
    "request-logs-expire": {
        "task": "tenants.tasks.request_logs_expire",
        "schedule": float(os.environ.get("FAIRLANE_REQUEST_LOG_SWEEP_SECONDS", "3600")),
    },
    "stored-responses-expire": {
        "task": "routing.tasks.stored_responses_expire",
        "schedule": 86400.0,
    },
    "files-orphans-sweep": {
        "task": "routing.tasks.files_orphans_sweep",
        "schedule": 86400.0,
    },
}

# --- auth, sessions, security ------------------------------------------------------------
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
# Passwords (local accounts), then single sign-on's callback (tenants/sso/backend.py), which
# answers only the requests its callback view hands it.
AUTHENTICATION_BACKENDS = [
    "django.contrib.auth.backends.ModelBackend",
    "tenants.sso.backend.OidcBackend",
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
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'"],
        "img-src": ["'self'", "data:"],
        "connect-src": ["'self'"],
        "object-src": ["'none'"],
        "base-uri": ["'self'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
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

# --- i18n, static --------------------------------------------------------------------------
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
STATIC_ROOT = Path(os.environ.get("STATIC_ROOT", BASE_DIR / "staticfiles"))
STATICFILES_DIRS = [BASE_DIR / "static"]
STORAGES: dict[str, dict[str, Any]] = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}

# --- REST framework and the OpenAPI schema ---------------------------------------------------
REST_FRAMEWORK: dict[str, Any] = {
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
    REST_FRAMEWORK["DEFAULT_RENDERER_CLASSES"].append(
        "rest_framework.renderers.BrowsableAPIRenderer"
    )
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

# --- SCIM 2.0 (django-scim2) with Fairlane's adapters: a tenant's bearer token per request ---
SCIM_SERVICE_PROVIDER = {
    "NETLOC": "localhost",  # unused: locations come from the request (BASE_LOCATION_GETTER)
    "AUTHENTICATION_SCHEMES": [
        {
            "type": "oauthbearertoken",
            "name": "Bearer token",
            "description": "A tenant's SCIM token",
            "primary": True,
        }
    ],
    "USER_MODEL_GETTER": "tenants.scim.adapters.membership_model",
    "USER_ADAPTER": "tenants.scim.adapters.ScimUser",
    "GROUP_MODEL": "tenants.models.ScimGroup",
    "GROUP_ADAPTER": "tenants.scim.adapters.ScimGroupAdapter",
    "USER_FILTER_PARSER": "tenants.scim.filters.UserFilterQuery",
    "GROUP_FILTER_PARSER": "tenants.scim.filters.GroupFilterQuery",
    "BASE_LOCATION_GETTER": "tenants.scim.adapters.base_location",
    "GET_EXTRA_MODEL_FILTER_KWARGS_GETTER": "tenants.scim.adapters.tenant_filter_getter",
    "AUTH_CHECK_MIDDLEWARE": "tenants.scim.auth.ScimTokenAuth",
    "SERVICE_PROVIDER_CONFIG_MODEL": "tenants.scim.adapters.ServiceProviderConfig",
    "WWW_AUTHENTICATE_HEADER": 'Bearer realm="fairlane-scim"',
}

# --- Fairlane: its own settings (FAIRLANE_*) ------------------------------------------------
from fairlane_settings import *  # noqa: E402, F403

# Uploaded files and batch outputs (routing/batches/storage.py).
STORAGES["fairlane_files"] = {
    "BACKEND": FAIRLANE_FILES_STORAGE_BACKEND,  # noqa: F405
    "OPTIONS": FAIRLANE_FILES_STORAGE_OPTIONS,  # noqa: F405
}

# /metrics adds up every process of a deployment when PROMETHEUS_MULTIPROC_DIR is set: the
# directory is emptied when the deployment starts (platform/metrics_export.py).
from metrics_export import multiproc_dir_prepare  # noqa: E402

multiproc_dir_prepare()

LOG_LEVEL = os.environ.get("LOG_LEVEL", "INFO")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    # Each line names the request it is about: its trace id and request id ("-" outside one).
    "filters": {"trace": {"()": "workers.serving.trace.TraceLogFilter"}},
    "formatters": {
        "plain": {
            "format": "%(asctime)s %(levelname)s %(name)s "
            "[trace=%(trace_id)s request=%(request_id)s] %(message)s"
        }
    },
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": "plain", "filters": ["trace"]}
    },
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
}
