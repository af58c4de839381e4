"""Budgets per API key, per member and per model list (issue 32), on the budget services and
the management API: which budgets a request counts against, all or none, a window opened
mid-window, settlement, release and the reservation's change on every window, reconciliation
of the extra windows, the alert's scope, and the API's scopes, roles and tenant walls."""

import pytest
from django.utils import timezone

from tenants.errors import BudgetExhausted
from tenants.models import AlertEvent, Budget, BudgetWindow, Membership, Reservation, Role, Scope
from tenants.services.alerts.events import event_payload
from tenants.services.budget_reconcile import budget_windows_reconcile
from tenants.services.budgets import budget_create as create
from tenants.services.budgets import (
    budget_release,
    budget_reserve,
    budget_reserve_adjust,
    budget_window_current,
    budgets_for_caller,
)
from tenants.services.keys import api_key_create
from tenants.services.ledger import Usage, budget_settle
from tests.tenants.test_apis import assert_error

pytestmark = pytest.mark.django_db

_ids = iter(range(10**6))


def rid() -> str:
    return f"scope-{next(_ids)}"


@pytest.fixture
def mias_key(tenant, agent, mia):
    return api_key_create(
        tenant=tenant, agent=agent, created_by=mia, scopes=[Scope.INFERENCE], actor_role=Role.MEMBER
    )[0]


def hold(api_key, model: str, amount: int, request_id: str) -> Reservation:
    return budget_reserve(
        tenant=api_key.tenant,
        agent=api_key.agent,
        api_key=api_key,
        model=model,
        amount_microcents=amount,
        request_id=request_id,
    )


def _window(budget) -> BudgetWindow:
    return budget_window_current(budget=budget, now=timezone.now())


def test_each_scope_applies_to_its_own_requests_only(tenant, agent, api_key, mia, mias_key):
    membership = Membership.objects.get(tenant=tenant, user=mia)
    tenant_b = create(tenant=tenant, limit_microcents=10**9)
    agent_b = create(tenant=tenant, agent=agent, limit_microcents=10**9)
    key_b = create(tenant=tenant, api_key=api_key[0], limit_microcents=10**9)
    member_b = create(tenant=tenant, member=membership, limit_microcents=10**9)
    big_b = create(tenant=tenant, model_names=["big"], limit_microcents=10**9)
    agent_big = create(tenant=tenant, agent=agent, model_names=["big", "huge"], limit_microcents=9)

    def applying(key, model):
        return {
            b.pk for b in budgets_for_caller(tenant=tenant, agent=agent, api_key=key, model=model)
        }

    assert applying(api_key[0], "small") == {tenant_b.pk, agent_b.pk, key_b.pk}
    assert applying(api_key[0], "big") == {
        tenant_b.pk,
        agent_b.pk,
        key_b.pk,
        big_b.pk,
        agent_big.pk,
    }
    assert applying(mias_key, "small") == {tenant_b.pk, agent_b.pk, member_b.pk}
    # The agent's and the tenant's for every model come first: the primary windows.
    first = budgets_for_caller(tenant=tenant, agent=agent, api_key=mias_key, model="big")[:2]
    assert [b.pk for b in first] == [agent_b.pk, tenant_b.pk]
    # A key handed over to the agent when its member left no longer counts as theirs.
    mias_key.handed_over_at = timezone.now()
    mias_key.save(update_fields=["handed_over_at"])
    assert member_b.pk not in applying(mias_key, "small")


def test_a_hold_takes_every_window_or_none_and_the_binding_budget_refuses(tenant, agent, api_key):
    key = api_key[0]
    agent_b = create(tenant=tenant, agent=agent, limit_microcents=1_000)
    key_b = create(tenant=tenant, api_key=key, limit_microcents=300)
    big_b = create(tenant=tenant, model_names=["big"], limit_microcents=500)
    held = hold(
        key,
        "big",
        250,
        rid(),
    )
    assert sorted(held.extra_windows) == sorted([_window(key_b).pk, _window(big_b).pk])
    with pytest.raises(BudgetExhausted) as refused:
        hold(
            key,
            "big",
            100,
            rid(),
        )
    assert f"API key {key.prefix}'s daily budget" in str(refused.value)
    assert refused.value.window_id == _window(key_b).pk
    # Nothing of the refused hold stayed anywhere.
    assert [_window(b).reserved_microcents for b in (agent_b, key_b, big_b)] == [250, 250, 250]
    # Another model: the key's budget still binds; the model's does not apply.
    with pytest.raises(BudgetExhausted):
        hold(
            key,
            "small",
            60,
            rid(),
        )
    other_key, _ = api_key_create(tenant=tenant, agent=agent, scopes=[Scope.INFERENCE])
    with pytest.raises(BudgetExhausted) as by_model:
        hold(
            other_key,
            "big",
            300,
            rid(),
        )
    assert "tenant's daily budget for big" in str(by_model.value)
    hold(
        other_key,
        "small",
        300,
        rid(),
    )
    assert [_window(b).reserved_microcents for b in (agent_b, key_b, big_b)] == [550, 250, 250]


def test_settle_release_and_adjust_cover_the_extra_windows(tenant, agent, api_key):
    key = api_key[0]
    key_b = create(tenant=tenant, api_key=key, limit_microcents=1_000)
    big_b = create(tenant=tenant, model_names=["big"], limit_microcents=700)
    tenant_b = create(tenant=tenant, limit_microcents=5_000)
    windows = lambda: [  # noqa: E731
        (w.spent_microcents, w.reserved_microcents)
        for w in (_window(b) for b in (key_b, big_b, tenant_b))
    ]
    first, second = rid(), rid()
    for request_id in (first, second):
        hold(key, "big", 300, request_id)
    # Growing a hold is checked on every window: the model's has room for 100 more only.
    with pytest.raises(BudgetExhausted) as grown:
        budget_reserve_adjust(tenant=tenant, request_id=first, amount_microcents=450)
    assert grown.value.window_id == _window(big_b).pk
    assert windows() == [(0, 600), (0, 600), (0, 600)]
    budget_reserve_adjust(tenant=tenant, request_id=first, amount_microcents=400)
    row = budget_settle(
        tenant=tenant, request_id=first, cost_microcents=120, usage=Usage(model="big")
    )
    assert row.cost_microcents == 120 and row.unbilled_microcents == 0
    budget_release(tenant=tenant, request_id=second)
    assert windows() == [(120, 0), (120, 0), (120, 0)]
    report = budget_windows_reconcile(tenant=tenant)
    assert report.windows_checked == 3 and not report.differences


def test_a_late_settlement_is_capped_by_the_tightest_extra_window(tenant, agent, api_key):
    key = api_key[0]
    key_b = create(tenant=tenant, api_key=key, limit_microcents=200)
    request_id = rid()
    hold(key, "m", 100, request_id)
    row = budget_settle(
        tenant=tenant, request_id=request_id, cost_microcents=500, usage=Usage(model="m")
    )
    assert (row.cost_microcents, row.unbilled_microcents) == (200, 300)
    assert (_window(key_b).spent_microcents, _window(key_b).reserved_microcents) == (200, 0)


def test_a_budget_created_mid_window_takes_the_open_holds_and_spend_of_its_scope(
    tenant, agent, api_key
):
    key = api_key[0]
    other_key, _ = api_key_create(tenant=tenant, agent=agent, scopes=[Scope.INFERENCE])
    settled, open_hold, others = rid(), rid(), rid()
    for request_id, used in ((settled, key), (open_hold, key), (others, other_key)):
        hold(used, "m", 100, request_id)
    budget_settle(tenant=tenant, request_id=settled, cost_microcents=40, usage=Usage(model="m"))
    key_b = create(tenant=tenant, api_key=key, limit_microcents=1_000)
    window = _window(key_b)
    assert (window.spent_microcents, window.reserved_microcents) == (40, 100)
    assert Reservation.objects.get(request_id=open_hold).extra_windows == [window.pk]
    budget_settle(tenant=tenant, request_id=open_hold, cost_microcents=70, usage=Usage(model="m"))
    window.refresh_from_db()
    assert (window.spent_microcents, window.reserved_microcents) == (110, 0)
    assert not budget_windows_reconcile(tenant=tenant).differences


def test_reconciliation_finds_a_difference_planted_in_an_extra_window(tenant, agent, api_key):
    key_b = create(tenant=tenant, api_key=api_key[0], limit_microcents=1_000)
    request_id = rid()
    hold(api_key[0], "m", 100, request_id)
    budget_settle(tenant=tenant, request_id=request_id, cost_microcents=30, usage=Usage())
    window = _window(key_b)
    BudgetWindow.objects.filter(pk=window.pk).update(spent_microcents=31)
    [found] = budget_windows_reconcile(tenant=tenant).differences
    assert (found.window_id, found.owner, found.spent_stored, found.spent_recomputed) == (
        window.pk,
        api_key[0].prefix,
        31,
        30,
    )
    budget_windows_reconcile(tenant=tenant, fix=True)
    window.refresh_from_db()
    assert window.spent_microcents == 30


def test_the_exhaustion_alert_says_which_scope_refused(tenant, agent, api_key, mia, mias_key):
    membership = Membership.objects.get(tenant=tenant, user=mia)
    member_b = create(tenant=tenant, member=membership, limit_microcents=100)
    budget_reserve(
        tenant=tenant, agent=agent, api_key=mias_key, amount_microcents=100, request_id=rid()
    )
    for _ in range(2):  # once per window
        with pytest.raises(BudgetExhausted):
            budget_reserve(
                tenant=tenant, agent=agent, api_key=mias_key, amount_microcents=1, request_id=rid()
            )
    [event] = AlertEvent.objects.filter(budget=member_b, event="budget_crossed")
    payload = event_payload(event)
    assert payload["event_group"] == "user" and payload["user_id"] == "mia"
    assert payload["fairlane"]["scope"] == "member"
    assert "Member mia's daily budget is spent" in payload["event_message"]


# -- the management API ------------------------------------------------------------------------


def test_the_api_creates_a_budget_at_each_scope(client_for, owner, tenant, agent, api_key, mia):
    client = client_for(user=owner)
    membership = Membership.objects.get(tenant=tenant, user=mia)
    bodies = {
        "tenant": {},
        "agent": {"agent": str(agent.pk)},
        "api_key": {"api_key": str(api_key[0].pk), "models": ["big", "huge"]},
        "member": {"member": membership.pk},
    }
    for scope, body in bodies.items():
        response = client.post(
            "/api/tenants/acme/budgets/", {**body, "limit_microcents": 1_000}, format="json"
        )
        assert response.status_code == 201, response.content
        out = response.json()
        assert out["scope"] == scope and out["limit_microcents"] == 1_000
    listed = {b["scope"]: b for b in client.get("/api/tenants/acme/budgets/").json()["results"]}
    assert listed["api_key"]["api_key_prefix"] == api_key[0].prefix
    assert listed["api_key"]["models"] == ["big", "huge"]
    assert listed["member"]["member_username"] == "mia"
    # The same scope and models again is a conflict; other models are another budget.
    again = client.post(
        "/api/tenants/acme/budgets/",
        {"api_key": str(api_key[0].pk), "models": ["huge", "big"], "limit_microcents": 5},
        format="json",
    )
    assert_error(again, 409, "conflict")
    assert Budget.objects.filter(tenant=tenant).count() == 4


@pytest.mark.parametrize(
    "body, status, param",
    [
        ({"agent": "AGENT", "member": "MEMBER"}, 400, "scope"),
        ({"models": "big"}, 400, "models"),
        ({"models": [""]}, 400, "models[0]"),
    ],
)
def test_bad_scopes_are_400s_and_change_nothing(
    client_for, owner, tenant, agent, mia, body, status, param
):
    membership = Membership.objects.get(tenant=tenant, user=mia)
    filled = {
        k: (str(agent.pk) if v == "AGENT" else membership.pk if v == "MEMBER" else v)
        for k, v in body.items()
    }
    response = client_for(user=owner).post(
        "/api/tenants/acme/budgets/", {**filled, "limit_microcents": 5}, format="json"
    )
    assert_error(response, status, "invalid_request", param)
    assert not Budget.objects.exists()


def test_a_viewer_or_member_cannot_create_one_and_another_tenants_owners_are_not_found(
    client_for, member_of, owner, tenant, agent, other_tenant, other_api_key, other_owner
):
    for role in (Role.VIEWER, Role.MEMBER):
        person = member_of(tenant, role)
        response = client_for(user=person).post(
            "/api/tenants/acme/budgets/", {"limit_microcents": 5}, format="json"
        )
        assert response.status_code == 403, response.content
    others_member = Membership.objects.get(tenant=other_tenant, user=other_owner)
    client = client_for(user=owner)
    for body in ({"api_key": str(other_api_key[0].pk)}, {"member": others_member.pk}):
        response = client.post(
            "/api/tenants/acme/budgets/", {**body, "limit_microcents": 5}, format="json"
        )
        assert response.status_code == 404, response.content
    assert not Budget.objects.exists()
    # A reservation never counts against another tenant's key budget.
    create(tenant=other_tenant, api_key=other_api_key[0], limit_microcents=0)
    held = budget_reserve(tenant=tenant, agent=agent, amount_microcents=5, request_id=rid())
    assert held.extra_windows == []


def test_usage_splits_and_filters_by_every_scope(
    client_for, owner, tenant, agent, api_key, mia, mias_key
):
    membership = Membership.objects.get(tenant=tenant, user=mia)
    for key, model, cost in ((api_key[0], "big", 30), (mias_key, "big", 7), (mias_key, "s", 5)):
        request_id = rid()
        hold(key, model, 100, request_id)
        budget_settle(
            tenant=tenant, request_id=request_id, cost_microcents=cost, usage=Usage(model=model)
        )
    client = client_for(user=owner)

    def summary(query: str) -> list[tuple]:
        response = client.get(f"/api/tenants/acme/usage/summary/?{query}")
        assert response.status_code == 200, response.content
        return [
            (r["agent_name"], r["api_key_prefix"], r["member_username"], r["model"])
            + (r["cost_microcents"],)
            for r in response.json()["results"]
        ]

    assert summary("group_by=member") == [
        (None, None, "mia", None, 12),
        (None, None, None, None, 30),
    ]
    assert summary("group_by=api_key,model&model=big") == sorted(
        [
            (None, api_key[0].prefix, None, "big", 30),
            (None, mias_key.prefix, None, "big", 7),
        ],
        key=lambda r: r[1].removeprefix("fl-"),
    )
    assert summary(f"member={membership.pk}") == [
        ("support-bot", None, None, "big", 7),
        ("support-bot", None, None, "s", 5),
    ]
    listed = client.get(f"/api/tenants/acme/usage/?api_key={api_key[0].pk}").json()["results"]
    assert [r["cost_microcents"] for r in listed] == [30]
    assert_error(
        client.get("/api/tenants/acme/usage/summary/?group_by=team"),
        400,
        "invalid_request",
        "group_by",
    )
    page = client_for(user=owner).get("/portal/t/acme/usage/?split=member&range=24h")
    assert page.status_code == 200 and "mia" in page.content.decode()


def test_a_soft_level_on_a_key_budget_demotes_that_keys_requests_only(tenant, agent, api_key):
    from tenants.services.budget_soft import budget_soft_check

    key = api_key[0]
    other, _ = api_key_create(tenant=tenant, agent=agent, scopes=[Scope.INFERENCE])
    key_b = create(
        tenant=tenant,
        api_key=key,
        limit_microcents=1_000,
        soft_limit_microcents=500,
        soft_action="demote",
    )
    budget_reserve(tenant=tenant, agent=agent, api_key=key, amount_microcents=600, request_id=rid())
    mine = budget_soft_check(tenant=tenant, agent=agent, api_key=key, model="m")
    theirs = budget_soft_check(tenant=tenant, agent=agent, api_key=other, model="m")
    assert mine.demoted == f"budget={key_b.pk}; spent=60%"
    assert theirs.demoted == ""
    assert AlertEvent.objects.filter(budget=key_b, rule="soft_limit").count() == 1


def test_the_admin_fixes_who_a_budget_is_for_and_checks_the_owners_tenant(
    tenant, agent, other_agent, api_key, rf, admin_user
):
    from django.contrib.admin.sites import site
    from django.core.exceptions import ValidationError

    with pytest.raises(ValidationError) as invalid:
        Budget(tenant=tenant, agent=other_agent, limit_microcents=1).full_clean()
    assert "agent" in invalid.value.message_dict
    with pytest.raises(ValidationError) as two:
        Budget(tenant=tenant, agent=agent, api_key=api_key[0], limit_microcents=1).full_clean()
    assert "agent" in two.value.message_dict
    budget = create(tenant=tenant, api_key=api_key[0], limit_microcents=1)
    admin = site._registry[Budget]
    request = rf.get("/")
    request.user = admin_user
    fixed = admin.get_readonly_fields(request, budget)
    assert {"tenant", "agent", "api_key", "member", "model_names"} <= set(fixed)
    assert "api_key" not in admin.get_readonly_fields(request, None)
