"""Fairlane's own settings (FAIRLANE_*), read from the environment with the defaults documented
here and in docs/configuration.md; settings.py takes them all in."""

import json
import os
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from environment import DATA_DIR, REDIS_URL, SECRET_KEY, env_bool, env_int, env_list

# --- API keys, tenancy, the portal ----------------------------------------------------------
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
# The bearer token /metrics requires (see FAIRLANE_METRICS_LOOPBACK for none).
FAIRLANE_METRICS_TOKEN = os.environ.get("FAIRLANE_METRICS_TOKEN", "")
# Whether any signed-in user may create a tenant through the API (they become its owner).
FAIRLANE_SELF_SERVICE_TENANTS = env_bool("FAIRLANE_SELF_SERVICE_TENANTS", True)
# Portal sign-in throttle: after this many failed sign-ins for one username (or from one
# address) within the window, further attempts are refused until it passes.
FAIRLANE_LOGIN_MAX_FAILURES = env_int("FAIRLANE_LOGIN_MAX_FAILURES", 5)
FAIRLANE_LOGIN_WINDOW_SECONDS = env_int("FAIRLANE_LOGIN_WINDOW_SECONDS", 900)
# Lifetime of the key the playground page mints for itself (held in the page's memory only).
FAIRLANE_PLAYGROUND_KEY_SECONDS = env_int("FAIRLANE_PLAYGROUND_KEY_SECONDS", 3600)
# --- budget alerts and the ops dashboard ----------------------------------------------------
# Webhook URLs resolving to loopback, private, link-local... addresses are refused (SSRF)
# unless this is set (e.g. a receiver inside the cluster).
FAIRLANE_ALERT_WEBHOOK_ALLOW_PRIVATE = env_bool("FAIRLANE_ALERT_WEBHOOK_ALLOW_PRIVATE", False)
# A failed delivery is retried after this many seconds, doubling (at most an hour), until it
# has been attempted this many times.
FAIRLANE_ALERT_RETRY_BASE_SECONDS = float(os.environ.get("FAIRLANE_ALERT_RETRY_BASE_SECONDS", "10"))
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

# --- governance: the audit log, single sign-on, SCIM (docs/configuration.md) ----
# The Ed25519 key (a PEM file) that signs the audit log's checkpoints: the platform's key,
# the one that signs models. Empty: the development key (FAIRLANE_DEV_SIGNING_KEY), if any.
FAIRLANE_AUDIT_SIGNING_KEY = os.environ.get("FAIRLANE_AUDIT_SIGNING_KEY", "")
# How often the beat signs a checkpoint of every chain's head.
FAIRLANE_AUDIT_CHECKPOINT_SECONDS = env_int("FAIRLANE_AUDIT_CHECKPOINT_SECONDS", 3600)
# Records older than this many days are deleted by the retention role (0: kept forever).
FAIRLANE_AUDIT_RETENTION_DAYS = env_int("FAIRLANE_AUDIT_RETENTION_DAYS", 0)
# The retention role's own connection (PostgreSQL): never the application's role.
FAIRLANE_AUDIT_RETENTION_DATABASE_URL = os.environ.get("FAIRLANE_AUDIT_RETENTION_DATABASE_URL", "")
# Request logs (opt-in per tenant): the Fernet keys that encrypt their content at rest, comma
# separated, the first one encrypting and every one decrypting (rotation: put the new key first,
# run `manage.py request_logs_rotate`, then drop the old one). Empty: one key derived from
# SECRET_KEY (changing SECRET_KEY then makes the stored logs unreadable).
FAIRLANE_REQUEST_LOG_KEYS = env_list("FAIRLANE_REQUEST_LOG_KEYS", "")
# How often expired request logs are deleted (the beat; the embedded server's own thread).
FAIRLANE_REQUEST_LOG_SWEEP_SECONDS = env_int("FAIRLANE_REQUEST_LOG_SWEEP_SECONDS", 3600)
# How long a process remembers that a tenant keeps no request logs (its requests then skip the
# database). Turning logs on reaches the other processes within this; turning them off is
# immediate everywhere (a tenant keeping logs is read for every request). 0: read every time.
FAIRLANE_REQUEST_LOG_OFF_CACHE_SECONDS = float(
    os.environ.get("FAIRLANE_REQUEST_LOG_OFF_CACHE_SECONDS", "5")
)
from oidc_settings import oidc_providers_from_env  # noqa: E402

# Single sign-on: the identity providers (FAIRLANE_OIDC_PROVIDERS and their own variables).
FAIRLANE_OIDC_PROVIDERS = oidc_providers_from_env()
# Seconds to wait for an identity provider (discovery, token, keys, userinfo).
FAIRLANE_OIDC_TIMEOUT_SECONDS = float(os.environ.get("FAIRLANE_OIDC_TIMEOUT_SECONDS", "10"))

# --- serving ----------------------------------------------------------------------------------
# embedded: engines run in the API process (a thread pool); distributed: on GPU workers that
# take requests from the Redis fair queue. "celery", its former name (it runs no Celery task
# per request), is still accepted. Each process builds its runtime from this one setting
# (routing/runtimes.py); nothing else asks which mode it is in.
FAIRLANE_ENGINE_MODE = os.environ.get("FAIRLANE_ENGINE_MODE") or (
    "distributed" if REDIS_URL else "embedded"
)
if FAIRLANE_ENGINE_MODE == "celery":
    FAIRLANE_ENGINE_MODE = "distributed"
if FAIRLANE_ENGINE_MODE not in {"embedded", "distributed"}:
    raise ImproperlyConfigured("FAIRLANE_ENGINE_MODE must be 'embedded' or 'distributed'")
# Without FAIRLANE_METRICS_TOKEN, whether /metrics answers loopback clients: yes in the
# embedded mode (one machine), no in the distributed one (a proxy on the host would make every
# client look local); set a token there.
FAIRLANE_METRICS_LOOPBACK = env_bool(
    "FAIRLANE_METRICS_LOOPBACK", FAIRLANE_ENGINE_MODE == "embedded"
)
FAIRLANE_GPU_QUEUE = os.environ.get("FAIRLANE_GPU_QUEUE", "gpu")
# Where presets are generated and model directories live.
FAIRLANE_MODEL_DIR = Path(os.environ.get("FAIRLANE_MODEL_DIR", DATA_DIR / "models"))
# --- model provenance (workers/artifacts) ---------------------------------------------------
# require: a model loads only with a manifest signed by a trusted key; warn: an unsigned model,
# or one signed by a key not trusted here, loads with a warning. Integrity (hashes, extra or
# missing files, links, pickles) is enforced under both. Distributed deployments require.
FAIRLANE_MODEL_SIGNATURES = os.environ.get("FAIRLANE_MODEL_SIGNATURES") or (
    "warn" if FAIRLANE_ENGINE_MODE == "embedded" else "require"
)
if FAIRLANE_MODEL_SIGNATURES not in {"require", "warn"}:
    raise ImproperlyConfigured("FAIRLANE_MODEL_SIGNATURES must be 'require' or 'warn'")
# Trusted public keys, comma-separated: `ed25519:<base64>` or paths of PEM files.
FAIRLANE_TRUSTED_KEYS = env_list("FAIRLANE_TRUSTED_KEYS", "")
# The local development key that signs presets and trained models when they are created (and
# is trusted here); `make run` creates it once. Empty: none (production).
FAIRLANE_DEV_SIGNING_KEY = os.environ.get(
    "FAIRLANE_DEV_SIGNING_KEY", str(DATA_DIR / "signing" / "dev-ed25519.pem")
)
# Models a GPU worker loads at start (comma-separated names; empty: every enabled model).
FAIRLANE_WORKER_MODELS = env_list("FAIRLANE_WORKER_MODELS", "")
FAIRLANE_ENGINE_DEVICE = os.environ.get("FAIRLANE_ENGINE_DEVICE", "cpu")
FAIRLANE_ENGINE_KV_CACHE_MB = env_int("FAIRLANE_ENGINE_KV_CACHE_MB", 256)
# KV blocks an engine keeps in host memory when its pool evicts or preempts them, copied back
# instead of recomputed (0: no CPU tier). A block is block size x layers x 2 x KV heads x
# head dim x dtype bytes.
FAIRLANE_ENGINE_KV_CPU_TIER_BLOCKS = env_int("FAIRLANE_ENGINE_KV_CPU_TIER_BLOCKS", 0)
if FAIRLANE_ENGINE_KV_CPU_TIER_BLOCKS < 0:
    raise ImproperlyConfigured("FAIRLANE_ENGINE_KV_CPU_TIER_BLOCKS must be >= 0 (0: off)")
FAIRLANE_ENGINE_MAX_NUM_SEQS = env_int("FAIRLANE_ENGINE_MAX_NUM_SEQS", 64)
FAIRLANE_ENGINE_THREADS = env_int("FAIRLANE_ENGINE_THREADS", 0) or None
# While an interactive (realtime or standard lane) sequence runs or waits, at most this many
# bulk-lane sequences (batches) run in each engine step; 0: no cap. On the CPU a step's cost
# grows with its sequences, so the default there is 1; a GPU's decode step costs about the
# same for 1 or 9 sequences, so there none.
FAIRLANE_ENGINE_BULK_SEQS_BESIDE_INTERACTIVE = env_int(
    "FAIRLANE_ENGINE_BULK_SEQS_BESIDE_INTERACTIVE",
    1 if FAIRLANE_ENGINE_DEVICE == "cpu" else 0,
)
# Cap on any model's context (0: the checkpoint's own).
FAIRLANE_MAX_MODEL_LEN = env_int("FAIRLANE_MAX_MODEL_LEN", 0) or None
FAIRLANE_HEARTBEAT_SECONDS = env_int("FAIRLANE_HEARTBEAT_SECONDS", 2)
# --- models on vLLM (runtime "vllm": a `vllm serve` child process of the worker) -------------
# The command (split like a shell would); the model directory and our flags are appended.
FAIRLANE_VLLM_COMMAND = os.environ.get("FAIRLANE_VLLM_COMMAND") or "vllm serve"
# Further flags for every vLLM child (e.g. "--gpu-memory-utilization 0.85
# --tensor-parallel-size 2").
FAIRLANE_VLLM_ARGS = os.environ.get("FAIRLANE_VLLM_ARGS", "")
# How long a child may take to answer /health after it is started (loading, compiling).
FAIRLANE_VLLM_START_TIMEOUT_SECONDS = env_int("FAIRLANE_VLLM_START_TIMEOUT_SECONDS", 900)
# How often a running child's /health and /metrics are read.
FAIRLANE_VLLM_HEALTH_SECONDS = float(os.environ.get("FAIRLANE_VLLM_HEALTH_SECONDS", "2"))
# --- fair queue -----------------------------------------------------------------------------
# A taken request's claim by its worker; the worker's heartbeat renews it. Lapsed: the worker
# died, and the request goes back to the head of its tenant's queue. FAIRLANE_LEASE_SECONDS,
# its former name, is still read when FAIRLANE_CLAIM_SECONDS is unset.
FAIRLANE_CLAIM_SECONDS = env_int("FAIRLANE_CLAIM_SECONDS", env_int("FAIRLANE_LEASE_SECONDS", 10))
# Prefix of the queues' Redis keys, to run separate deployments (or test runs) on one Redis.
FAIRLANE_QUEUE_NAMESPACE = os.environ.get("FAIRLANE_QUEUE_NAMESPACE", "")
# Minimum shares of recent dispatches for the lower lanes while higher lanes are backlogged.
FAIRLANE_MIN_SHARE_STANDARD = float(os.environ.get("FAIRLANE_MIN_SHARE_STANDARD", "0.10"))
FAIRLANE_MIN_SHARE_BULK = float(os.environ.get("FAIRLANE_MIN_SHARE_BULK", "0.05"))
# Requests a GPU worker runs at once (its runner threads); its engine batches them all.
FAIRLANE_WORKER_CONCURRENCY = env_int("FAIRLANE_WORKER_CONCURRENCY", 64)
# Fairness inside the batch: a worker whose slots are all taken still takes up to this many
# requests more, of tenants under their share of its slots, and its engine preempts the
# sequences of the tenant furthest over its share to run them (0: off, a flood holds every
# slot until its requests finish). The engines of every mode preempt so while it is > 0.
FAIRLANE_FAIR_EXTRA_SLOTS = env_int("FAIRLANE_FAIR_EXTRA_SLOTS", 4)
if FAIRLANE_FAIR_EXTRA_SLOTS < 0:
    raise ImproperlyConfigured("FAIRLANE_FAIR_EXTRA_SLOTS must be >= 0 (0: off)")
# With it: while a tenant runs under its share, the others run at most their share of each
# engine step (the rest of their sequences wait a step). On a CPU, where a step's cost grows
# with its sequences, the quiet tenant then decodes in smaller, faster steps (measured in
# interleaved rounds at the same work done, docs/benchmarks.md), so it is on there; a GPU's
# decode step costs about the same for 1 or 9 sequences, so there it is off.
FAIRLANE_ENGINE_FAIR_STEP_SHARE = env_bool(
    "FAIRLANE_ENGINE_FAIR_STEP_SHARE", FAIRLANE_ENGINE_DEVICE == "cpu"
)
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
FAIRLANE_SETTLEMENT_DIR = Path(os.environ.get("FAIRLANE_SETTLEMENT_DIR", DATA_DIR / "settlements"))
FAIRLANE_SETTLEMENT_RETRY_SECONDS = float(os.environ.get("FAIRLANE_SETTLEMENT_RETRY_SECONDS", "2"))

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
# A client that does not stream is answered from a call that does not stream (one body, not a
# chunk per token) when even a backend this slow writes the whole answer within the backend's
# timeout (max_tokens <= timeout_seconds x this), since that timeout bounds the wait for a
# response's first byte; longer answers are streamed upstream. 0: every call streams.
FAIRLANE_WHOLE_ANSWER_TOKENS_PER_SECOND = float(
    os.environ.get("FAIRLANE_WHOLE_ANSWER_TOKENS_PER_SECOND", "10")
)
# Threads in each API process's event loop pool, where /v1 does its database work (holds,
# settlements: routing/sync.py) and its other blocking calls. asyncio's default is
# min(32, cores + 4), six on two cores: under load every hold and settlement queued for those
# six, and group commit (tenants/services/group_commit.py) could batch only as many as had a
# thread. Threads past FAIRLANE_DB_POOL_SIZE wait for a connection. 0: asyncio's default.
FAIRLANE_API_THREADS = env_int("FAIRLANE_API_THREADS", 16)
# The hold's and the settlement's statements (tenants/services/budget_sql.py) are prepared on
# each database connection the first time it runs them. Django leaves psycopg's prepared
# statements off for everything else, for the sake of transaction-mode poolers; set 0 behind
# one that cannot keep protocol-level prepared statements (PgBouncer before 1.21, or without
# max_prepared_statements).
FAIRLANE_DB_PREPARE = env_bool("FAIRLANE_DB_PREPARE", True)
# Images in chat requests: what one counts for a budget hold (and when a provider reports no
# usage): above GPT-4o's 1,105 and Claude's ~1,600 at their largest; raise it for models that
# bill images as many more tokens (gpt-4o-mini: up to ~37,000).
FAIRLANE_IMAGE_WORST_TOKENS = env_int("FAIRLANE_IMAGE_WORST_TOKENS", 2500)
# Anthropic takes images as bytes: an http(s) image is fetched by the API process, within
# these limits (Anthropic's own is 5 MB), and never from private, loopback or link-local
# addresses unless FAIRLANE_IMAGE_FETCH_ALLOW_PRIVATE is set (tests; a trusted network).
FAIRLANE_IMAGE_MAX_BYTES = env_int("FAIRLANE_IMAGE_MAX_BYTES", 5 * 1024 * 1024)
FAIRLANE_IMAGE_FETCH_TIMEOUT_SECONDS = float(
    os.environ.get("FAIRLANE_IMAGE_FETCH_TIMEOUT_SECONDS", "10")
)
FAIRLANE_IMAGE_FETCH_ALLOW_PRIVATE = env_bool("FAIRLANE_IMAGE_FETCH_ALLOW_PRIVATE", False)
# Responses API: stored responses (`store`, the default) are kept this many days, then
# deleted (0: kept until deleted).
FAIRLANE_RESPONSES_RETENTION_DAYS = env_int("FAIRLANE_RESPONSES_RETENTION_DAYS", 30)
# How long a request waits in a scarce backend's lease queue before falling through.
FAIRLANE_LEASE_WAIT_SECONDS = float(os.environ.get("FAIRLANE_LEASE_WAIT_SECONDS", "5"))
# How long the registry read by the router is reused before it is read again (seconds).
FAIRLANE_ROUTING_CACHE_SECONDS = float(os.environ.get("FAIRLANE_ROUTING_CACHE_SECONDS", "2"))

# --- Files and batches (docs/api.md#files-and-batches) ----------------------------------------
# Where uploaded files and batch outputs are kept: a Django storage class and its options
# (JSON). The default is the local filesystem under FAIRLANE_FILES_DIR (the embedded mode).
# FAIRLANE_FILES_S3_BUCKET selects an S3-compatible bucket instead (the distributed mode):
# django-storages' S3 storage (routing/batches/s3.py streams its downloads), private objects,
# signature v4, never overwriting. Its credentials are boto3's own chain (AWS_ACCESS_KEY_ID and
# AWS_SECRET_ACCESS_KEY, a web identity, an instance role), never a Fairlane setting, so they
# appear in no settings dump. FAIRLANE_FILES_STORAGE_OPTIONS, when set, is merged over these.
FAIRLANE_FILES_DIR = Path(os.environ.get("FAIRLANE_FILES_DIR", DATA_DIR / "files"))
FAIRLANE_FILES_S3_BUCKET = os.environ.get("FAIRLANE_FILES_S3_BUCKET", "")
# The S3 API's URL for a store other than AWS (MinIO, Ceph, R2...); empty: AWS's own.
FAIRLANE_FILES_S3_ENDPOINT_URL = os.environ.get("FAIRLANE_FILES_S3_ENDPOINT_URL", "")
FAIRLANE_FILES_S3_REGION = os.environ.get("FAIRLANE_FILES_S3_REGION", "")
# A key prefix inside the bucket (e.g. one per deployment sharing a bucket).
FAIRLANE_FILES_S3_PREFIX = os.environ.get("FAIRLANE_FILES_S3_PREFIX", "")
# "path" for stores that do not serve bucket subdomains (MinIO's default); empty: boto3's choice.
FAIRLANE_FILES_S3_ADDRESSING_STYLE = os.environ.get("FAIRLANE_FILES_S3_ADDRESSING_STYLE", "")
FAIRLANE_FILES_STORAGE_BACKEND = os.environ.get("FAIRLANE_FILES_STORAGE_BACKEND") or (
    "routing.batches.s3.S3FilesStorage"
    if FAIRLANE_FILES_S3_BUCKET
    else "django.core.files.storage.FileSystemStorage"
)
_files_options: dict[str, object] = {}
if "FileSystemStorage" in FAIRLANE_FILES_STORAGE_BACKEND:
    _files_options = {"location": str(FAIRLANE_FILES_DIR)}
elif FAIRLANE_FILES_S3_BUCKET:
    _files_options = {
        "bucket_name": FAIRLANE_FILES_S3_BUCKET,
        "endpoint_url": FAIRLANE_FILES_S3_ENDPOINT_URL or None,
        "region_name": FAIRLANE_FILES_S3_REGION or None,
        "location": FAIRLANE_FILES_S3_PREFIX,
        "addressing_style": FAIRLANE_FILES_S3_ADDRESSING_STYLE or None,
        "signature_version": "s3v4",
        "default_acl": None,
        "querystring_auth": True,
        "file_overwrite": False,
    }
FAIRLANE_FILES_STORAGE_OPTIONS = _files_options | json.loads(
    os.environ.get("FAIRLANE_FILES_STORAGE_OPTIONS") or "{}"
)
# The largest file one upload may be (bytes; a larger one is a 413 naming the limit).
FAIRLANE_FILE_MAX_BYTES = env_int("FAIRLANE_FILE_MAX_BYTES", 200 * 1024 * 1024)
# What one tenant's files may take in all (bytes; batch outputs count too).
FAIRLANE_FILES_TENANT_QUOTA_BYTES = env_int("FAIRLANE_FILES_TENANT_QUOTA_BYTES", 10 * 1024**3)
# Stored bytes that no file row names (a process killed between writing an upload and
# committing its row) are deleted by the daily sweep once they are this old.
FAIRLANE_FILES_ORPHAN_GRACE_SECONDS = env_int("FAIRLANE_FILES_ORPHAN_GRACE_SECONDS", 3600)
# The most lines one batch may hold.
FAIRLANE_BATCH_MAX_LINES = env_int("FAIRLANE_BATCH_MAX_LINES", 50_000)
# How many lines of one batch a runner has in flight at a time (the batch's pace: the queue
# holds at most this many of its requests per runner).
FAIRLANE_BATCH_IN_FLIGHT = env_int("FAIRLANE_BATCH_IN_FLIGHT", 8)
# Batch prices: each model's prices less this percentage, unless FAIRLANE_BATCH_DISCOUNTS
# names the model ("model=percent,...").
FAIRLANE_BATCH_DISCOUNT_PERCENT = env_int("FAIRLANE_BATCH_DISCOUNT_PERCENT", 50)
FAIRLANE_BATCH_DISCOUNTS = {
    name.strip(): int(percent)
    for name, _, percent in (
        item.rpartition("=") for item in env_list("FAIRLANE_BATCH_DISCOUNTS", "")
    )
}
# How often an idle runner looks for batches to advance (seconds).
FAIRLANE_BATCH_POLL_SECONDS = float(os.environ.get("FAIRLANE_BATCH_POLL_SECONDS", "2"))
# How long a runner's claim on a line lasts before another runner may take the line over.
FAIRLANE_BATCH_CLAIM_SECONDS = env_int("FAIRLANE_BATCH_CLAIM_SECONDS", 600)
# Whether this process runs batches (the API processes do by default, in both modes).
FAIRLANE_BATCH_RUNNER = env_bool("FAIRLANE_BATCH_RUNNER", True)
