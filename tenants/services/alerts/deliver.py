"""Sending alerts: one delivery per (alert, destination), claimed before each attempt so two
senders never send it at once, retried with exponential backoff (FAIRLANE_ALERT_RETRY_BASE_
SECONDS doubling, up to FAIRLANE_ALERT_DELIVERY_ATTEMPTS attempts), every attempt logged on
the delivery and in the process log. Webhook receivers should deduplicate on `webhook-id`.

Who sends is the runtime's alert sender, which hears `deliveries_created`: in the distributed
mode a Celery task per delivery (on the `default` queue), re-queued with a countdown after a
failure, and the beat's sweep for any that were lost; in the embedded mode a loop of the
server process (which also runs the sweep, as there is no beat).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from datetime import datetime, timedelta

import httpx
from cryptography.fernet import InvalidToken
from django.conf import settings
from django.core.mail import send_mail
from django.db import close_old_connections
from django.utils import timezone

from tenants.errors import InvalidRequest
from tenants.loops import BackgroundLoop
from tenants.metrics import DELIVERIES, SEP
from tenants.models import AlertDelivery, AlertDestination
from tenants.services.alerts.events import deliveries_created, event_payload
from tenants.services.alerts.webhooks import secret_decrypt, webhook_post

logger = logging.getLogger(__name__)

CLAIM_SECONDS = 120  # an attempt (a webhook times out after 10 s) owns its delivery this long
WEBHOOK_TIMEOUT_SECONDS = 10.0
MAX_BACKOFF_SECONDS = 3600.0


def backoff(attempts: int) -> float:
    """Seconds before the next attempt after `attempts` failed ones."""
    return min(
        settings.FAIRLANE_ALERT_RETRY_BASE_SECONDS * 2 ** (attempts - 1), MAX_BACKOFF_SECONDS
    )


def _send(delivery: AlertDelivery) -> tuple[bool, int | None, str]:
    """One attempt: (delivered, HTTP status, error)."""
    event = delivery.event
    if delivery.kind == AlertDestination.Kind.EMAIL:
        send_mail(
            subject=f"[Fairlane] {event.tenant.slug}: {event.event.replace('_', ' ')}",
            message=f"{event.message}\n\nTenant: {event.tenant.name} ({event.tenant.slug})"
            f"\nAlert: {event.event} ({event.rule})\nAt: "
            f"{event.created_at.isoformat()}\n",
            from_email=settings.DEFAULT_FROM_EMAIL,
            recipient_list=[delivery.target],
        )
        return True, None, ""
    destination = delivery.destination
    if destination is None:
        return False, None, "the destination was removed"
    body = json.dumps(event_payload(event), separators=(",", ":")).encode()
    status = webhook_post(
        url=delivery.target,
        body=body,
        secret=secret_decrypt(destination.secret_encrypted),
        msg_id=str(delivery.pk),
        timestamp=int(time.time()),
        timeout=WEBHOOK_TIMEOUT_SECONDS,
    )
    return 200 <= status < 300, status, "" if 200 <= status < 300 else f"HTTP {status}"


def _attempt(delivery: AlertDelivery) -> tuple[bool, int | None, str]:
    try:
        return _send(delivery)
    except InvalidRequest as exc:  # the URL now resolves to a refused address
        return False, None, exc.message
    except InvalidToken:
        return False, None, "the webhook secret cannot be decrypted (FAIRLANE_CREDENTIALS_KEY?)"
    except (httpx.HTTPError, OSError) as exc:
        return False, None, f"{type(exc).__name__}: {exc}"[:300]


def alert_delivery_send(*, delivery_id: str, now: datetime | None = None) -> float | None:
    """Make one attempt at a delivery that is due; returns the seconds until the next one
    when it failed and will be retried (None: delivered, gave up, or not ours to send)."""
    now = now or timezone.now()
    claimed = AlertDelivery.objects.filter(
        pk=delivery_id,
        status=AlertDelivery.Status.PENDING,
        next_attempt_at__lte=now,
    ).update(next_attempt_at=now + timedelta(seconds=CLAIM_SECONDS))
    if not claimed:
        return None
    delivery = AlertDelivery.objects.select_related(
        "event__tenant", "event__agent", "destination"
    ).get(pk=delivery_id)
    ok, status, error = _attempt(delivery)
    delivery.attempts += 1
    delivery.log = [
        *delivery.log,
        {"at": timezone.now().isoformat(), "ok": ok, "status": status, "error": error},
    ][-20:]
    retry_in = None
    if ok:
        delivery.status, delivery.delivered_at = AlertDelivery.Status.DELIVERED, timezone.now()
        outcome = "delivered"
    elif delivery.attempts >= settings.FAIRLANE_ALERT_DELIVERY_ATTEMPTS:
        delivery.status, outcome = AlertDelivery.Status.FAILED, "failed"
    else:
        retry_in, outcome = backoff(delivery.attempts), "retry"
        delivery.next_attempt_at = timezone.now() + timedelta(seconds=retry_in)
    delivery.save(update_fields=["attempts", "log", "status", "delivered_at", "next_attempt_at"])
    DELIVERIES.add(f"{delivery.kind}{SEP}{outcome}")
    log = logger.info if ok else logger.warning
    log(
        "alert %s (%s, tenant %s) to %s %s: attempt %d %s%s",
        delivery.event_id,
        delivery.event.event,
        delivery.event.tenant.slug,
        delivery.kind,
        delivery.pk,
        delivery.attempts,
        outcome,
        f" ({error})" if error else "",
    )
    return retry_in


def alert_deliveries_send_due(*, now: datetime | None = None, limit: int = 200) -> int:
    """Attempt every delivery that is due (the beat's and the embedded sender's loop)."""
    now = now or timezone.now()
    due = list(
        AlertDelivery.objects.filter(status=AlertDelivery.Status.PENDING, next_attempt_at__lte=now)
        .order_by("next_attempt_at")
        .values_list("pk", flat=True)[:limit]
    )
    for delivery_id in due:
        alert_delivery_send(delivery_id=str(delivery_id), now=now)
    return len(due)


class CeleryAlertSender:
    """The distributed runtime's sender: a Celery task per new delivery (`send(delivery_id)`
    queues it), re-queued with a countdown after a failure; the beat sweeps for lost ones."""

    def __init__(self, send: Callable[[str], None]) -> None:
        self.send = send
        self.loop = None

    def connect(self) -> None:
        deliveries_created.connect(self._kick, dispatch_uid=f"alerts-celery-{id(self)}")

    def disconnect(self) -> None:
        deliveries_created.disconnect(dispatch_uid=f"alerts-celery-{id(self)}")

    def _kick(self, *, ids: list[str], **kwargs) -> None:
        for delivery_id in ids:
            self.send(delivery_id)


class EmbeddedAlertSender:
    """The embedded runtime's sender and beat: a loop of the server process that sends due
    deliveries (at once when new ones are created) and sweeps the rules every
    FAIRLANE_ALERT_SWEEP_SECONDS (forecasts)."""

    def __init__(self, sweep: Callable[[], int]) -> None:
        self.sweep = sweep
        self._swept = 0.0
        self.loop = BackgroundLoop(
            "alert-sender", self._step, interval=lambda: settings.FAIRLANE_ALERT_SWEEP_SECONDS
        )

    def connect(self) -> None:
        deliveries_created.connect(self._kick, dispatch_uid=f"alerts-embedded-{id(self)}")

    def disconnect(self) -> None:
        deliveries_created.disconnect(dispatch_uid=f"alerts-embedded-{id(self)}")

    def _kick(self, **kwargs) -> None:
        self.loop.wake()

    def _step(self) -> float:
        try:
            if time.monotonic() - self._swept >= settings.FAIRLANE_ALERT_SWEEP_SECONDS:
                self._swept = time.monotonic()
                self.sweep()
            alert_deliveries_send_due()
            return min(_next_due_seconds(), settings.FAIRLANE_ALERT_SWEEP_SECONDS)
        finally:
            close_old_connections()


def _next_due_seconds() -> float:
    first = (
        AlertDelivery.objects.filter(status=AlertDelivery.Status.PENDING)
        .order_by("next_attempt_at")
        .values_list("next_attempt_at", flat=True)
        .first()
    )
    if first is None:
        return settings.FAIRLANE_ALERT_SWEEP_SECONDS
    return max((first - timezone.now()).total_seconds(), 0.05)
