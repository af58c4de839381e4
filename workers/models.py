"""The model registry: which models the platform serves, where their weights come from, and
what a token costs. Which worker hosts which model is live state, kept in heartbeats."""

from django.core.validators import MinValueValidator
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
    price_input_per_mtok = models.BigIntegerField(
        default=0, validators=[MinValueValidator(0)])
    price_output_per_mtok = models.BigIntegerField(
        default=0, validators=[MinValueValidator(0)])
    price_cached_per_mtok = models.BigIntegerField(
        default=0, validators=[MinValueValidator(0)])
    is_enabled = models.BooleanField(default=True)
    # Provenance, from the signed manifest when the model was registered (model_register).
    manifest_digest = models.CharField(max_length=80, blank=True, default="")
    signer = models.CharField(max_length=80, blank=True, default="",
                              help_text="key id (sha256 of the public key) that signed it")
    origin = models.CharField(max_length=500, blank=True, default="",
                              help_text="where the weights came from, per the manifest")
    license = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        from django.core.exceptions import ValidationError

        for field in ("price_input_per_mtok", "price_output_per_mtok", "price_cached_per_mtok"):
            if getattr(self, field) > MAX_MICROCENTS:
                raise ValidationError({field: "Price is out of range."})
