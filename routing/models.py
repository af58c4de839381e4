"""The backend registry: where compute happens (our engine pool, remote Fairlane engines,
OpenAI-compatible servers such as vLLM, and paid APIs), which models each serves under which
upstream name and price, and how each agent's requests are routed over them.

Credentials are never stored in plain text: a backend names an environment variable
(`env:OPENAI_API_KEY`) or holds its secret encrypted (see routing/credentials.py).
"""

from datetime import timedelta

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from tenants.models import MAX_MICROCENTS, Agent, name_validator


class BackendKind(models.TextChoices):
    LOCAL = "local", "local engine pool"
    FAIRLANE = "fairlane", "remote Fairlane engine"
    OPENAI_COMPATIBLE = "openai_compatible", "OpenAI-compatible server (vLLM, TGI, ...)"
    OPENROUTER = "openrouter", "OpenRouter"
    OPENAI = "openai", "OpenAI"
    ANTHROPIC = "anthropic", "Anthropic"


# The default fall-through order when an agent names no chain: our own engines first, then
# remote ones, then paid APIs.
KIND_ORDER: list[str] = [
    BackendKind.LOCAL,
    BackendKind.FAIRLANE,
    BackendKind.OPENAI_COMPATIBLE,
    BackendKind.OPENROUTER,
    BackendKind.ANTHROPIC,
    BackendKind.OPENAI,
]


class Accelerator(models.TextChoices):
    CPU = "cpu"
    GPU = "gpu"
    TPU = "tpu"
    NPU = "npu"


class Health(models.TextChoices):
    UNKNOWN = "unknown"  # never probed: routable, ranked after live ones
    LIVE = "live"
    STALE = "stale"  # no successful probe lately: routable, ranked last
    OFFLINE = "offline"  # probes fail: not routed to until one succeeds


def _supports(feature: str) -> models.BooleanField:
    return models.BooleanField(
        null=True,
        blank=True,
        default=None,
        help_text=f"Serves {feature}. Empty: the default (the backend "
        "kind's, or for a model its backend's).",
    )


def _price() -> models.BigIntegerField:
    return models.BigIntegerField(
        default=0, validators=[MinValueValidator(0), MaxValueValidator(MAX_MICROCENTS)]
    )


class Backend(models.Model):
    name = models.CharField(max_length=100, unique=True, validators=[name_validator])
    kind = models.CharField(max_length=32, choices=BackendKind.choices)
    base_url = models.URLField(
        blank=True,
        default="",
        help_text="e.g. https://api.openai.com (without /v1); empty for the local engine pool.",
    )
    # A reference such as env:OPENAI_API_KEY, resolved when used; or an encrypted secret.
    credential_ref = models.CharField(max_length=200, blank=True, default="")
    credential_encrypted = models.TextField(blank=True, default="", editable=False)
    # Capabilities.
    context_length = models.PositiveIntegerField(default=0, help_text="0: the model's own.")
    hidden_states = models.BooleanField(default=False, help_text="Serves embeddings.")
    accelerator = models.CharField(
        max_length=8, choices=Accelerator.choices, default=Accelerator.GPU
    )
    max_concurrency = models.PositiveIntegerField(default=0, help_text="0: no limit.")
    continuous_batching = models.BooleanField(default=False)
    paged_kv = models.BooleanField(default=False)
    zone = models.CharField(max_length=64, blank=True, default="")
    # What chat requests may use: by default openai, openrouter and anthropic have all three,
    # openai_compatible (vLLM) JSON modes, fairlane none; local has JSON mode (json_object) by
    # its own guided decoding, whatever these say (routing.backends.base).
    supports_tools = _supports("tools (function calling)")
    supports_json_schema = _supports("response_format json_object / json_schema")
    supports_vision = _supports("image inputs")
    # Energy: millijoules per generated token, and the zone's grid carbon intensity.
    energy_mj_per_token = models.PositiveIntegerField(default=0)
    carbon_g_per_kwh = models.PositiveIntegerField(default=0)
    # On-demand (lease_seconds 0) or reserved: a request holds one of max_concurrency leases
    # (1 when unset) for lease_seconds, renewed while it streams; up to queue_depth others
    # wait for one, later ones fall through to the next backend.
    lease_seconds = models.PositiveIntegerField(default=0)
    queue_depth = models.PositiveIntegerField(default=0)
    timeout_seconds = models.FloatField(
        default=60.0,
        validators=[MinValueValidator(0.1)],
        help_text="Longest wait for the first byte and between stream chunks.",
    )
    is_enabled = models.BooleanField(default=True)
    # Written by the health beat (routing.tasks.backends_probe).
    health = models.CharField(max_length=16, choices=Health.choices, default=Health.UNKNOWN)
    health_checked_at = models.DateTimeField(null=True, blank=True)
    health_ok_at = models.DateTimeField(null=True, blank=True)
    health_detail = models.CharField(max_length=300, blank=True, default="")
    probe_p50_ms = models.FloatField(default=0.0)
    probe_p95_ms = models.FloatField(default=0.0)
    probe_error_rate = models.FloatField(default=0.0)
    # The last probes, newest last: [[milliseconds, ok], ...].
    probe_samples = models.JSONField(default=list, blank=True, editable=False)
    # What the last failed request said (clients only get a code and a generic message);
    # written at most every few seconds per API process.
    last_error = models.CharField(max_length=500, blank=True, default="", editable=False)
    last_error_at = models.DateTimeField(null=True, blank=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.kind})"

    @property
    def has_credential(self) -> bool:
        return bool(self.credential_ref or self.credential_encrypted)

    def health_at(self, now) -> str:
        """Health as of `now`: a live backend whose last successful probe is older than
        FAIRLANE_HEALTH_STALE_SECONDS reads stale, whether or not any probe ran since (the beat
        may be down). Offline and never-probed backends read as recorded."""
        stale_after = timedelta(seconds=settings.FAIRLANE_HEALTH_STALE_SECONDS)
        if self.health == Health.LIVE and (
            self.health_ok_at is None or now - self.health_ok_at > stale_after
        ):
            return Health.STALE
        return self.health


class BackendModel(models.Model):
    """A model a backend serves: the name clients use, the backend's own name for it, and what
    a million tokens cost there (micro-cents)."""

    backend = models.ForeignKey(Backend, on_delete=models.CASCADE, related_name="models")
    model = models.CharField(max_length=200, validators=[name_validator])
    upstream_name = models.CharField(
        max_length=200, blank=True, default="", help_text="Empty: the same as model."
    )
    price_input_per_mtok = _price()
    price_output_per_mtok = _price()
    price_cached_per_mtok = _price()
    # Where this model differs from its backend (e.g. a text-only model on a vision backend).
    supports_tools = _supports("tools (function calling)")
    supports_json_schema = _supports("response_format json_object / json_schema")
    supports_vision = _supports("image inputs")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["backend", "model"], name="backend_model_unique")
        ]
        ordering = ["backend", "model"]

    def __str__(self) -> str:
        return f"{self.backend.name}:{self.model}"


class Policy(models.TextChoices):
    CHAIN = "chain", "chain order"
    ROUND_ROBIN = "round_robin"
    LEAST_BUSY = "least_busy"
    LATENCY = "latency", "latency-weighted (rolling p95)"
    COST = "cost", "cost-weighted"
    ENERGY = "energy", "energy (joule)-weighted"
    CARBON = "carbon", "carbon-weighted"
    AFFINITY = "affinity", "prefix/KV affinity"


class AgentRouting(models.Model):
    """How one agent's requests are routed. Without a row: every backend serving the model,
    in the default kind order (local, remote Fairlane, OpenAI-compatible, OpenRouter, Anthropic,
    OpenAI), by chain order."""

    agent = models.OneToOneField(Agent, on_delete=models.CASCADE, related_name="routing")
    # Backend names in fall-through order; empty: the default order.
    chain = models.JSONField(default=list, blank=True)
    policy = models.CharField(max_length=16, choices=Policy.choices, default=Policy.CHAIN)
    # Cascade: model names from cheapest to best. A request for any of them starts at the
    # first and escalates while the answer's mean token log-probability is under threshold.
    cascade = models.JSONField(default=list, blank=True)
    cascade_threshold = models.FloatField(default=-1.0)

    def __str__(self) -> str:
        return f"routing of {self.agent}"


class StoredResponse(models.Model):
    """A Responses API answer kept for its tenant (`store`, OpenAI's default): read back by id,
    and chained by `previous_response_id`. `items` is the conversation the model was sent
    (every earlier turn of the chain and this request's input, in the API's item shape,
    without `instructions`, which a chain does not carry), `body` the response object as it
    was answered. Gone after FAIRLANE_RESPONSES_RETENTION_DAYS (`expires_at`)."""

    id = models.CharField(primary_key=True, max_length=64)
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="+")
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True, db_index=True)
    # JSON as text: a JSON column (jsonb) cannot hold U+0000, which a client's text may.
    items = models.TextField()
    body = models.TextField()

    def __str__(self) -> str:
        return self.id


class CapacityFit(models.Model):
    """A model's capacity plan (issue 34): its engine's fitted step times, the request mix and
    targets it was planned for, and what the queue simulation predicted from them. One row
    per model, the latest plan; the ops dashboard sets the model's load against it."""

    class Source(models.TextChoices):
        CALIBRATE = "calibrate", "calibration run"
        WORKERS = "workers", "the workers' recorded steps"

    model = models.CharField(max_length=200, unique=True)
    source = models.CharField(max_length=16, choices=Source.choices)
    step_model = models.JSONField()  # StepTimeModel.to_dict()
    shape = models.JSONField()  # the engine's max_num_seqs, token budget, yielding lanes
    mix = models.JSONField()  # the request classes
    targets = models.JSONField()  # p95 targets in seconds
    rate = models.FloatField()  # the rate asked about (requests/s)
    capacity_rps = models.FloatField()  # one worker's knee: the highest rate meeting the targets
    saturation_rps = models.FloatField()  # one worker's completions/s under a standing backlog
    workers_needed = models.PositiveIntegerField(null=True, blank=True)
    prediction = models.JSONField()  # at `rate`: p50/p95 TTFT and latency, throughput
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"capacity of {self.model}"


# Files and batches (routing/batches/) keep their models in a module of their own.
from routing.batch_models import Batch, BatchLine, StoredFile  # noqa: E402, F401
