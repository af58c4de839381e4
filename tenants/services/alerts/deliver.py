"""Sending alerts: one delivery per (alert, destination), claimed before each attempt so two
senders never send it at once, retried with exponential backoff (FAIRLANE_ALERT_RETRY_BASE_
SECONDS doubling, up to FAIRLANE_ALERT_DELIVERY_ATTEMPTS attempts), every attempt logged on
the delivery and in the process log. Webhook receivers should deduplicate on `webhook-id`.

Who sends (FAIRLANE_ALERTS_IN_PROCESS, decided by the mode): in the distributed mode a Celery
task per delivery (on the `default` queue), re-queued with a countdown after a failure, and
the beat's sweep for any that were lost; in the embedded mode one thread of the server process
(which also runs the sweep, as there is no beat).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from datetime import datetime, timedelta

import httpx
from cryptography.fernet import InvalidToken
from django.conf import settings
from django.core.mail import send_mail
from django.db import close_old_connections
from django.utils import timezone

from tenants.errors import InvalidRequest
from tenants.metrics import DELIVERIES, SEP
from tenants.models import AlertDelivery, AlertDestination
from tenants.services.alerts.events import event_payload
from tenants.services.alerts.webhooks import secret_decrypt, webhook_post

logger = logging.getLogger(__name__)

CLAIM_SECONDS = 120  # an attempt (a webhook times out after 10 s) owns its delivery this long
WEBHOOK_TIMEOUT_SECONDS = 10.0
MAX_BACKOFF_SECONDS = 3600.0


def backoff(attempts: int) -> float:
    """Seconds before the next attempt after `attempts` failed ones."""
    return min(settings.FAIRLANE_ALERT_RETRY_BASE_SECONDS * 2 ** (attempts - 1),
               MAX_BACKOFF_SECONDS)


def _send(delivery: AlertDelivery) -> tuple[bool, int | None, str]:
    """One attempt: (delivered, HTTP status, error)."""
    event = delivery.event
    if delivery.kind == AlertDestination.Kind.EMAIL:
        send_mail(subject=f"[Fairlane] {event.tenant.slug}: {event.event.replace('_', ' ')}",
                  message=f"{event.message}\n\nTenant: {event.tenant.name} ({event.tenant.slug})"
                          f"\nAlert: {event.event} ({event.rule})\nAt: "
                          f"{event.created_at.isoformat()}\n",
                  from_email=settings.DEFAULT_FROM_EMAIL, recipient_list=[delivery.target])
        return True, None, ""
    destination = delivery.destination
    if destination is None:
        return False, None, "the destination was removed"
    body = json.dumps(event_payload(event), separators=(",", ":")).encode()
    status = webhook_post(url=delivery.target, body=body,
                          secret=secret_decrypt(destination.secret_encrypted),
                          msg_id=str(delivery.pk), timestamp=int(time.time()),
                          timeout=WEBHOOK_TIMEOUT_SECONDS)
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
        pk=delivery_id, status=AlertDelivery.Status.PENDING, next_attempt_at__lte=now,
    ).update(next_attempt_at=now + timedelta(seconds=CLAIM_SECONDS))
    if not claimed:
        return None
    delivery = AlertDelivery.objects.select_related("event__tenant", "event__agent",
                                                    "destination").get(pk=delivery_id)
    ok, status, error = _attempt(delivery)
    delivery.attempts += 1
    delivery.log = [*delivery.log, {"at": timezone.now().isoformat(), "ok": ok,
                                    "status": status, "error": error}][-20:]
    retry_in = None
    if ok:
        delivery.status, delivery.delivered_at = AlertDelivery.Status.DELIVERED, timezone.now()
        outcome = "delivered"
    elif delivery.attempts >= settings.FAIRLANE_ALERT_DELIVERY_ATTEMPTS:
        delivery.status, outcome = AlertDelivery.Status.FAILED, "failed"
    else:
        retry_in, outcome = backoff(delivery.attempts), "retry"
        delivery.next_attempt_at = timezone.now() + timedelta(seconds=retry_in)
    delivery.save(update_fields=["attempts", "log", "status", "delivered_at",
                                 "next_attempt_at"])
    DELIVERIES.add(f"{delivery.kind}{SEP}{outcome}")
    log = logger.info if ok else logger.warning
    log("alert %s (%s, tenant %s) to %s %s: attempt %d %s%s", delivery.event_id,
        delivery.event.event, delivery.event.tenant.slug, delivery.kind, delivery.pk,
        delivery.attempts, outcome, f" ({error})" if error else "")
    return retry_in


def alert_deliveries_send_due(*, now: datetime | None = None, limit: int = 200) -> int:
    """Attempt every delivery that is due (the beat's and the embedded sender's loop)."""
    now = now or timezone.now()
    due = list(AlertDelivery.objects.filter(status=AlertDelivery.Status.PENDING,
                                            next_attempt_at__lte=now)
               .order_by("next_attempt_at").values_list("pk", flat=True)[:limit])
    for delivery_id in due:
        alert_delivery_send(delivery_id=str(delivery_id), now=now)
    return len(due)


def deliveries_kick(ids: list[str]) -> None:
    """Start sending new deliveries (called once their alert has committed)."""
    if not ids:
        return
    if settings.FAIRLANE_ALERTS_IN_PROCESS:
        embedded_sender.wake()
    else:
        from tenants.tasks import alert_delivery_send as task

        for delivery_id in ids:
            task.apply_async((delivery_id,), ignore_result=True)


class EmbeddedSender:
    """The embedded mode's sender and beat: sends due deliveries, and sweeps the rules every
    FAIRLANE_ALERT_SWEEP_SECONDS (forecasts), on a daemon thread of the server process."""

    def __init__(self) -> None:
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="alert-sender",
                                                daemon=True)
                self._thread.start()

    def wake(self) -> None:
        self.start()
        self._wake.set()

    def _loop(self) -> None:
        from tenants.services.alerts.evaluate import budget_alerts_sweep

        swept = 0.0
        while settings.FAIRLANE_ALERTS_IN_PROCESS:  # else Celery and the beat send
            self._wake.clear()
            try:
                if time.monotonic() - swept >= settings.FAIRLANE_ALERT_SWEEP_SECONDS:
                    swept = time.monotonic()
                    budget_alerts_sweep()
                alert_deliveries_send_due()
                wait = _next_due_seconds()
            except Exception:  # a thread boundary: log, and try again later
                logger.exception("alert sender failed")
                wait = 5.0
            finally:
                close_old_connections()
            self._wake.wait(min(wait, settings.FAIRLANE_ALERT_SWEEP_SECONDS))


def _next_due_seconds() -> float:
    first = (AlertDelivery.objects.filter(status=AlertDelivery.Status.PENDING)
             .order_by("next_attempt_at").values_list("next_attempt_at", flat=True).first())
    if first is None:
        return settings.FAIRLANE_ALERT_SWEEP_SECONDS
    return max((first - timezone.now()).total_seconds(), 0.05)


embedded_sender = EmbeddedSender()
