"""Stored responses, per tenant (services and selectors): written once when a response with
`store` ends, read back by id, chained, deleted. Every read is scoped to the tenant, and an
expired one is gone: another tenant's response, a deleted one and an expired one are the same
404."""

from __future__ import annotations

import json
import secrets
from datetime import timedelta

from django.conf import settings
from django.db.models import Q, QuerySet
from django.utils import timezone

from routing.models import StoredResponse
from routing.wire.render import json_bytes
from tenants.errors import NotFound
from tenants.models import Agent, Tenant


def _live(*, tenant: Tenant) -> QuerySet[StoredResponse]:
    return StoredResponse.objects.filter(tenant=tenant).filter(
        Q(expires_at__isnull=True) | Q(expires_at__gt=timezone.now())
    )


def _by_id(tenant: Tenant, response_id: str):
    """The tenant's live response of that id; none for an id with a NUL, which no row has
    (PostgreSQL's text holds none, and a query refuses one)."""
    if "\x00" in response_id:
        return StoredResponse.objects.none()
    return _live(tenant=tenant).filter(pk=response_id)


def stored_response_get(*, tenant: Tenant, response_id: str, param: str | None = None):
    """The tenant's live stored response, or a 404 naming `param` (previous_response_id)."""
    found = _by_id(tenant, response_id).first()
    if found is None:
        raise NotFound(f"No response found with id '{response_id}'.", param=param)
    return found


def stored_response_create(
    *, tenant: Tenant, agent: Agent, items: list[dict], body: dict
) -> StoredResponse:
    """Keep a response and the conversation it was sent; input items get ids where they had
    none (as OpenAI's input_items list them)."""
    days = settings.FAIRLANE_RESPONSES_RETENTION_DAYS
    named = [
        item if item.get("id") else {"id": f"{_prefix(item)}_{secrets.token_hex(12)}", **item}
        for item in items
    ]
    return StoredResponse.objects.create(
        id=body["id"],
        tenant=tenant,
        agent=agent,
        items=json_bytes(named).decode(),
        body=json_bytes(body).decode(),
        expires_at=timezone.now() + timedelta(days=days) if days else None,
    )


def _prefix(item: dict) -> str:
    return {"function_call": "fc", "function_call_output": "fco"}.get(
        item.get("type", "message"), "msg"
    )


def stored_response_delete(*, tenant: Tenant, response_id: str) -> None:
    deleted, _ = _by_id(tenant, response_id).delete()
    if not deleted:
        raise NotFound(f"No response found with id '{response_id}'.")


def stored_response_history(*, tenant: Tenant, response_id: str) -> list[dict]:
    """What a chained request is sent before its own input: the previous response's
    conversation and its output (the model's messages and function calls)."""
    previous = stored_response_get(
        tenant=tenant, response_id=response_id, param="previous_response_id"
    )
    return json.loads(previous.items) + json.loads(previous.body)["output"]


def stored_responses_expire() -> int:
    """Delete every tenant's expired responses (the beat, daily); how many went."""
    deleted, _ = StoredResponse.objects.filter(expires_at__lte=timezone.now()).delete()
    return deleted
