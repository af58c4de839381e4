"""Where alerts go: a tenant's email recipients and webhook URLs (set by its admins in the
portal), and the platform's (tenant None: set by operators in the ops dashboard; they receive
every tenant's alerts)."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.core.validators import EmailValidator
from django.db import transaction

from tenants.errors import InvalidRequest, NotFound
from tenants.models import AlertDestination, Tenant
from tenants.services.alerts.webhooks import secret_encrypt, secret_new, webhook_target
from tenants.services.audit import audit_change, snapshot
from tenants.services.validation import Conflict, save_validated

MAX_DESTINATIONS = 20


def _target_clean(*, kind: str, target) -> str:
    if kind == AlertDestination.Kind.EMAIL:
        value = target.strip() if isinstance(target, str) else ""
        try:
            EmailValidator()(value)
        except ValidationError:
            raise InvalidRequest("Enter a valid email address.", param="target") from None
        return value
    if kind == AlertDestination.Kind.WEBHOOK:
        webhook_target(target)
        return target.strip()
    raise InvalidRequest("kind must be email or webhook.", param="kind")


def alert_destination_add(
    *, tenant: Tenant | None, kind: str, target: str
) -> tuple[AlertDestination, str]:
    """Add a recipient or a webhook; for a webhook, its signing secret is returned (shown
    once, stored encrypted). Tenant None: the platform's (operators only)."""
    value = _target_clean(kind=kind, target=target)
    existing = AlertDestination.objects.filter(tenant=tenant)
    if existing.count() >= MAX_DESTINATIONS:
        raise InvalidRequest(f"At most {MAX_DESTINATIONS} alert destinations.", param="target")
    if existing.filter(kind=kind, target=value).exists():
        raise Conflict("That destination is already there.", param="target")
    secret = secret_new() if kind == AlertDestination.Kind.WEBHOOK else ""
    destination = AlertDestination(
        tenant=tenant,
        kind=kind,
        target=value,
        secret_encrypted=secret_encrypt(secret) if secret else "",
    )
    with transaction.atomic():
        destination = save_validated(destination, unique_param="target")
        audit_change("alert_destination.add", destination, tenant=tenant)
    return destination, secret


def alert_destination_get(*, tenant: Tenant | None, destination_id) -> AlertDestination:
    destination = AlertDestination.objects.filter(tenant=tenant, pk=destination_id).first()
    if destination is None:
        raise NotFound("No such alert destination.")
    return destination


def alert_destination_remove(*, tenant: Tenant | None, destination_id) -> None:
    """Remove it; deliveries already logged keep their target."""
    destination = alert_destination_get(tenant=tenant, destination_id=destination_id)
    with transaction.atomic():
        audit_change(
            "alert_destination.remove",
            destination,
            before=snapshot(destination),
            deleted=True,
            tenant=tenant,
        )
        destination.delete()
