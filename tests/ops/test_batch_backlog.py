"""The ops dashboard's queue panel shows the bulk lane's backlog from batches: per tenant,
its running batches, their lines waiting and in flight."""

from datetime import timedelta

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from routing.batch_models import Batch, BatchLine, BatchStatus, LineState

pytestmark = pytest.mark.django_db


def _batch(tenant, agent, states: list[str], status=BatchStatus.IN_PROGRESS) -> Batch:
    now = timezone.now()
    batch = Batch.objects.create(
        tenant=tenant,
        agent=agent,
        endpoint="/v1/chat/completions",
        status=status,
        total=len(states),
        created_at=now,
        expires_at=now + timedelta(hours=24),
    )
    BatchLine.objects.bulk_create(
        BatchLine(
            batch=batch, index=i, custom_id=f"c{i}", key=f"{batch.id}-{i}", body="{}", state=s
        )
        for i, s in enumerate(states)
    )
    return batch


def test_the_queue_panel_shows_each_tenants_batch_backlog(
    tenant, agent, other_tenant, other_agent, make_user
):
    _batch(tenant, agent, [LineState.PENDING] * 5 + [LineState.RUNNING] * 2 + [LineState.DONE])
    _batch(tenant, agent, [LineState.PENDING] * 3)
    _batch(other_tenant, other_agent, [LineState.PENDING, LineState.DONE])
    _batch(other_tenant, other_agent, [LineState.PENDING] * 9, status=BatchStatus.COMPLETED)
    client = Client()
    client.force_login(make_user("sam", is_staff=True))
    html = client.get(reverse("ops:panel", kwargs={"name": "queue"})).content.decode()
    acme = html.index('<tr data-backlog="acme">')
    globex = html.index('<tr data-backlog="globex">')
    assert acme < globex  # most waiting first
    assert "<td>2</td><td>8</td><td>2</td>" in html[acme:globex]
    assert "<td>1</td><td>1</td><td>0</td>" in html[globex:]
