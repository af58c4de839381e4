"""Provenance in the registry: the public keys trusted to sign models, and what each worker
found when it last checked a model before loading it (the admin shows both)."""

from django.core.exceptions import ValidationError
from django.db import models

from workers.artifacts.keys import KeyProblem, key_id, public_parse, public_text


class TrustedKey(models.Model):
    """An Ed25519 public key whose signatures make a model loadable, identified by the sha256
    of the raw key. Keys in FAIRLANE_TRUSTED_KEYS are trusted too; this is the registry's list."""

    name = models.CharField(max_length=200)
    public_key = models.TextField(help_text="ed25519:<base64> or a PEM public key block")
    key_id = models.CharField(max_length=80, unique=True, editable=False)
    is_active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.key_id[:19]}…)"

    def clean(self) -> None:
        try:
            key = public_parse(self.public_key)
        except KeyProblem as exc:
            raise ValidationError({"public_key": str(exc)}) from None
        self.public_key, self.key_id = public_text(key), key_id(key)


class ModelVerification(models.Model):
    """The last check of a model by one worker (its host name) before it loaded the model."""

    class Status(models.TextChoices):
        VERIFIED = "verified"  # signed by a trusted key, every file as listed
        UNTRUSTED = "untrusted"  # intact, signed by a key not trusted here (warn policy)
        UNSIGNED = "unsigned"  # no signature (warn policy)
        REFUSED = "refused"  # not loaded: see `reasons`

    model = models.ForeignKey(
        "workers.ServedModel", on_delete=models.CASCADE, related_name="verifications"
    )
    worker = models.CharField(max_length=200)
    status = models.CharField(max_length=20, choices=Status.choices)
    reasons = models.TextField(blank=True, default="")
    manifest_digest = models.CharField(max_length=80, blank=True, default="")
    signer = models.CharField(max_length=80, blank=True, default="")
    checked_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-checked_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["model", "worker"], name="one_verification_per_model_and_worker"
            )
        ]

    def __str__(self) -> str:
        return f"{self.model_id} on {self.worker}: {self.status}"
