"""The model registry: which models the platform serves, where their weights come from, and
what a token costs. Which worker hosts which model is live state, kept in heartbeats."""

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from tenants.models import MAX_MICROCENTS, name_validator
from workers.artifacts.models import ModelVerification, TrustedKey  # noqa: F401  (the app's models)


class ServedModel(models.Model):
    """A model clients name in `model`. Its source is a seeded preset (`preset:tiny`) or a local
    Hugging Face-format directory (config.json, *.safetensors, tokenizer.json)."""

    name = models.CharField(max_length=200, unique=True, validators=[name_validator])
    source = models.CharField(max_length=500)
    description = models.CharField(max_length=500, blank=True, default="")
    # Prices in micro-cents per million tokens ($0.10 per million = 10_000_000).
    price_input_per_mtok = models.BigIntegerField(default=0, validators=[MinValueValidator(0)])
    price_output_per_mtok = models.BigIntegerField(default=0, validators=[MinValueValidator(0)])
    price_cached_per_mtok = models.BigIntegerField(default=0, validators=[MinValueValidator(0)])
    is_enabled = models.BooleanField(default=True)

    class Runtime(models.TextChoices):
        ENGINE = "engine", "Fairlane engine"
        VLLM = "vllm", "vLLM (a managed `vllm serve` child of the worker)"

    # What runs the model on a worker: our engine in the worker's process, or vLLM as a child
    # process of the worker (workers/vllm/). Requests reach either through the same fair queue.
    runtime = models.CharField(max_length=8, choices=Runtime.choices, default=Runtime.ENGINE)
    # Provenance, from the signed manifest when the model was registered (model_register).
    manifest_digest = models.CharField(max_length=80, blank=True, default="")
    signer = models.CharField(
        max_length=80,
        blank=True,
        default="",
        help_text="key id (sha256 of the public key) that signed it",
    )
    origin = models.CharField(
        max_length=500,
        blank=True,
        default="",
        help_text="where the weights came from, per the manifest",
    )
    license = models.CharField(max_length=200, blank=True, default="")
    # Engine options (workers/engine): weight-only quantization at load, speculative decoding.
    quantization = models.CharField(
        max_length=8,
        blank=True,
        default="",
        choices=[("", "none"), ("int8", "int8"), ("int4", "int4")],
        help_text="int8: per output channel; int4: group-wise (quantization_group_size)",
    )
    quantization_group_size = models.PositiveSmallIntegerField(
        default=128, choices=[(32, "32"), (64, "64"), (128, "128")]
    )
    speculative_method = models.CharField(
        max_length=8,
        blank=True,
        default="",
        choices=[("", "none"), ("ngram", "n-gram prompt lookup"), ("draft", "draft model")],
    )
    speculative_tokens = models.PositiveSmallIntegerField(
        default=4,
        validators=[MinValueValidator(1), MaxValueValidator(16)],
        help_text="draft tokens (k) verified per step",
    )
    speculative_draft = models.CharField(
        max_length=500,
        blank=True,
        default="",
        help_text="the draft model's source (preset:<name>[@seed] or an absolute path), "
        "same tokenizer",
    )
    speculative_draft_only = models.BooleanField(
        default=False,
        help_text="the draft model alone; off: prompt lookup too, the engine choosing per "
        "batch size the method its measured costs favour",
    )
    # The pool of GPU workers hosting it, as the autoscaler (deploy/k8s) reads it from
    # fairlane_model_replicas_min/max: never fewer than min, never more than max.
    min_replicas = models.PositiveSmallIntegerField(
        default=1, help_text="workers hosting it, at least"
    )
    max_replicas = models.PositiveSmallIntegerField(
        default=1, help_text="workers hosting it, at most"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        for field in ("price_input_per_mtok", "price_output_per_mtok", "price_cached_per_mtok"):
            if getattr(self, field) > MAX_MICROCENTS:
                raise ValidationError({field: "Price is out of range."})
        if self.speculative_method == "draft" and not self.speculative_draft:
            raise ValidationError({"speculative_draft": "The draft method needs a draft model."})
        if self.runtime == self.Runtime.VLLM and (self.quantization or self.speculative_method):
            raise ValidationError(
                {
                    "runtime": "Quantization and speculative decoding are our "
                    "engine's options; give vLLM its own in "
                    "FAIRLANE_VLLM_ARGS."
                }
            )
        if self.min_replicas > self.max_replicas:
            raise ValidationError({"max_replicas": "The maximum is below the minimum."})
        if self.speculative_draft and self.speculative_method != "draft":
            raise ValidationError(
                {"speculative_draft": "A draft model is used by the draft method only."}
            )
        if self.speculative_draft_only and self.speculative_method != "draft":
            raise ValidationError(
                {"speculative_draft_only": "Draft-only applies to the draft method only."}
            )


class ModelVersion(models.Model):
    """One version of a served model: its weights' directory and the digest of their signed
    manifest. The primary takes the traffic its canaries leave (100 minus their weights);
    retired versions take none and are what a rollback returns to. A model without versions
    is served from its own `source` (its implicit version)."""

    class State(models.TextChoices):
        PRIMARY = "primary", "primary"
        CANARY = "canary", "canary"
        RETIRED = "retired", "retired"

    served_model = models.ForeignKey(ServedModel, on_delete=models.CASCADE, related_name="versions")
    label = models.CharField(max_length=64, validators=[name_validator])
    source = models.CharField(max_length=500)
    manifest_digest = models.CharField(max_length=80, blank=True, default="")
    state = models.CharField(max_length=8, choices=State.choices, default=State.RETIRED)
    weight = models.PositiveSmallIntegerField(
        default=0,
        validators=[MaxValueValidator(100)],
        help_text="a canary's share of the requests, in percent",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    # When it last stopped being the primary: a rollback returns to the latest such one.
    primary_until = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["served_model", "-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["served_model", "label"], name="model_version_label_unique"
            ),
            models.UniqueConstraint(
                fields=["served_model"],
                condition=models.Q(state="primary"),
                name="model_version_one_primary",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.served_model.name}@{self.label}"
