"""The ops dashboard's capacity panel: per model, the local pool's answered requests per
second over the last minutes against the capacity its plan predicted."""

import uuid

import pytest
from django.test import Client
from django.urls import reverse

from routing.models import CapacityFit
from tenants.services.budgets import budget_reserve
from tenants.services.ledger import Usage, budget_settle

pytestmark = pytest.mark.django_db


def answered(tenant, agent, *, model: str, backend: str) -> None:
    request_id = uuid.uuid4().hex
    budget_reserve(tenant=tenant, agent=agent, amount_microcents=10, request_id=request_id)
    budget_settle(
        tenant=tenant,
        request_id=request_id,
        cost_microcents=10,
        usage=Usage(backend=backend, model=model, prompt_tokens=5, completion_tokens=7),
    )


def fit(model: str, capacity_rps: float) -> CapacityFit:
    return CapacityFit.objects.create(
        model=model,
        source=CapacityFit.Source.CALIBRATE,
        step_model={"base": 0.001},
        shape={},
        mix=[],
        targets={"e2e_p95": 2.0, "ttft_p95": None},
        rate=0.05,
        capacity_rps=capacity_rps,
        saturation_rps=capacity_rps * 1.5,
        workers_needed=3,
        prediction={},
    )


def test_operator_sees_load_against_predicted_capacity(tenant, agent, budget, staff, distributed):
    fit("tiny", 0.02)
    for _ in range(3):  # 3 requests in 5 minutes: 0.01 req/s, half the capacity
        answered(tenant, agent, model="tiny", backend="local")
    answered(tenant, agent, model="tiny", backend="openai")  # not the local pool's load
    for _ in range(6):
        answered(tenant, agent, model="small", backend="local")  # no plan yet
    client = Client()
    client.force_login(staff)
    html = client.get(reverse("ops:panel", kwargs={"name": "capacity"})).content.decode()
    tiny_row = html.split('data-capacity="tiny"')[1].split("</tr>")[0]
    assert '<td data-figure="load">0.01</td>' in tiny_row
    assert '<td data-figure="capacity">0.02</td>' in tiny_row
    assert "capacity-ok" in tiny_row and "50 %" in tiny_row
    assert "/ 3 for 0.05 req/s" in tiny_row and "within p95 2000 ms" in tiny_row
    small_row = html.split('data-capacity="small"')[1].split("</tr>")[0]
    assert '<td data-figure="load">0.02</td>' in small_row and "no plan" in small_row
    page = client.get(reverse("ops:dashboard")).content.decode()
    assert 'id="panel-capacity"' in page and 'data-capacity="tiny"' in page


def test_load_over_capacity_is_flagged(tenant, agent, budget, staff, distributed):
    fit("tiny", 0.005)
    for _ in range(3):
        answered(tenant, agent, model="tiny", backend="local")
    client = Client()
    client.force_login(staff)
    html = client.get(reverse("ops:panel", kwargs={"name": "capacity"})).content.decode()
    row = html.split('data-capacity="tiny"')[1].split("</tr>")[0]
    assert "capacity-over" in row and "200 %" in row


def test_the_panel_is_for_operators_only(tenant, member_of):
    from tenants.models import Role

    client = Client()
    client.force_login(member_of(tenant, Role.ADMIN))
    assert client.get(reverse("ops:panel", kwargs={"name": "capacity"})).status_code == 403
