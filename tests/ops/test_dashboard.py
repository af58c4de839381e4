"""The ops dashboard, server side: staff only (sign-in page for visitors, 403 for everyone
else, whatever their role in a tenant); each panel shows the real state: the fair queue in
Redis (per lane and tenant, oldest wait, brownout), this process's engines and their models'
verification, backends with their error rates, spend from the ledger across tenants, alerts
and their deliveries; the platform's alert destinations."""

import json
import uuid
from datetime import timedelta

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from routing.metrics import ATTEMPTS_BY_MINUTE, ROUTE_ATTEMPTS
from routing.models import Backend
from tenants.models import AlertDestination, AlertEvent, Role
from tenants.services.alerts import alert_destination_add
from tenants.services.budgets import budget_create, budget_reserve
from tenants.services.ledger import Usage, budget_settle
from tests.conftest import wait_for
from workers.serving.catalog import model_get
from workers.transport import queue_for

pytestmark = pytest.mark.django_db
PAGES = [
    ("ops:dashboard", {}),
    ("ops:alerts", {}),
    ("ops:tenant", {"slug": "acme"}),
    ("ops:requests", {}),
] + [
    ("ops:panel", {"name": name})
    for name in ("backends", "queue", "workers", "capacity", "spend", "alerts")
]


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def spend(tenant, agent, amount: int, *, model: str = "tiny", backend: str = "local") -> None:
    request_id = uuid.uuid4().hex
    budget_reserve(tenant=tenant, agent=agent, amount_microcents=amount, request_id=request_id)
    budget_settle(
        tenant=tenant,
        request_id=request_id,
        cost_microcents=amount,
        usage=Usage(backend=backend, model=model, prompt_tokens=5, completion_tokens=7),
    )


def test_visitors_are_sent_to_sign_in_and_non_staff_are_refused(tenant, member_of, staff):
    for name, kwargs in PAGES:
        response = Client().get(reverse(name, kwargs=kwargs))
        assert response.status_code == 302 and response["Location"].startswith(
            "/portal/login/?next=/ops/"
        ), name
    owner = tenant.memberships.get(role=Role.OWNER).user
    for user in (owner, member_of(tenant, Role.ADMIN)):
        client = signed_in(user)
        for name, kwargs in PAGES:
            assert client.get(reverse(name, kwargs=kwargs)).status_code == 403, name
        response = client.post(
            reverse("ops:alert_destination_add"), {"kind": "email", "target": "x@acme.example"}
        )
        assert response.status_code == 403
    destination, _ = alert_destination_add(tenant=None, kind="email", target="noc@example.org")
    response = signed_in(owner).post(
        reverse("ops:alert_destination_remove", kwargs={"destination_id": destination.pk})
    )
    assert response.status_code == 403
    assert list(AlertDestination.objects.values_list("target", flat=True)) == ["noc@example.org"]
    assert signed_in(staff).get(reverse("ops:dashboard")).status_code == 200


def test_the_queue_panel_shows_depth_per_lane_and_tenant_with_the_oldest_wait(
    settings, namespace, tiny, tenant, other_tenant, staff, distributed
):
    settings.FAIRLANE_MAX_QUEUE_PER_LANE = 8
    queue = queue_for(distributed.redis, "tiny")
    try:
        for i in range(3):
            queue.enqueue(
                id=f"a{i}", tenant=str(tenant.pk), lane="standard", weight=1, cost=4, payload={}
            )
        queue.enqueue(
            id="g0", tenant=str(other_tenant.pk), lane="bulk", weight=1, cost=4, payload={}
        )
        queue.enqueue(
            id="g1", tenant=str(other_tenant.pk), lane="bulk", weight=1, cost=4, payload={}
        )
        page = signed_in(staff).get(reverse("ops:panel", kwargs={"name": "queue"}))
        html = page.content.decode()
        assert page.status_code == 200
        assert '<strong data-figure="waiting">5</strong>' in html
        assert '<tr data-lane="standard"><th scope="row">standard</th><td>3</td>' in html
        assert '<tr data-lane="bulk"><th scope="row">bulk</th><td>2</td>' in html
        assert "acme</a> 3 (standard)" in html and "globex</a> 2 (bulk)" in html
        assert "brownout: bulk shed" in html  # 5 of 8 waiting: past the first level
        assert html.count(" s</td>") >= 2  # the oldest waits of the two busy lanes
        assert queue.dequeue(worker="w") is not None
        html = signed_in(staff).get(reverse("ops:panel", kwargs={"name": "queue"})).content
        assert b'<strong data-figure="waiting">4</strong>' in html
    finally:
        queue.clear()


def test_the_workers_panel_shows_this_processs_engine_and_its_models_state(tiny, staff, embedded):
    # An engine an earlier test loaded in this (session-wide) runtime was checked before this
    # test's database existed: drop it, so this load checks the artifact and records it.
    embedded.engine_host.retire_unwanted(set(), grace=0)
    embedded.engine_host.load(model_get(name="tiny"))
    html = signed_in(staff).get(reverse("ops:panel", kwargs={"name": "workers"})).content.decode()
    assert 'data-worker="embedded" data-engine="tiny"' in html
    assert '<td data-figure="running">0</td>' in html
    assert 'data-model="tiny"><strong>tiny</strong> <span class="badge model-serving">' in html
    assert "verified" in html or "unsigned" in html  # its last check before the load


def test_the_backends_panel_adds_up_error_rates_and_shows_health(staff, namespace, distributed):
    Backend.objects.create(
        name="remote-a",
        kind="openai_compatible",
        base_url="http://127.0.0.1:9",
        health="offline",
        health_detail="connection refused",
    )
    ATTEMPTS_BY_MINUTE.clear(distributed.redis)
    for outcome in ("failed", "failed", "rate_limited", "ok", "budget"):
        ROUTE_ATTEMPTS.labels("remote-a", outcome).inc()
    html = signed_in(staff).get(reverse("ops:panel", kwargs={"name": "backends"})).content.decode()
    row = html[html.index('data-backend="remote-a"') :]
    row = row[: row.index("</tr>")]
    assert "health-offline" in row and "75.0 %" in row  # 3 of 4 that reached it
    assert '<span data-figure="attempts-5m">4</span>' in row
    assert 'data-backend="local"' in html


def test_the_backends_panel_adds_up_the_api_processes_breakers_from_their_list(
    staff, namespace, distributed, settings
):
    """Each API process publishes its breakers and requests in flight; the panel adds up the
    processes in the deployment's list (no SCAN of the keyspace): a process that stops leaves
    it at once, one whose publication expired is not counted, another deployment's never is."""
    from routing.breaker import breakers
    from routing.ops.processes import PROCESSES, BreakerPublisher, _snapshot, processes_breakers

    client = distributed.redis
    breakers.begin("remote-a")  # one request in flight here
    for _ in range(20):
        breakers.failure("remote-b")
    assert breakers.state("remote-b") == "open"
    one, two, gone = (BreakerPublisher(client) for _ in range(3))
    # `one` is this process (the session's runtime may publish it too, with the same figures)
    two.id, gone.id = "api-2:20", "api-3:30"
    for publisher in (one, two, gone):
        publisher.publish()
    pipe = client.pipeline(transaction=False)  # a process that died: its breakers expire
    PROCESSES.write(pipe, "dead:40", json.dumps({"backends": _snapshot()}), 0.2)
    pipe.execute()
    wait_for(lambda: client.get(PROCESSES.key("dead:40")) is None, timeout=10)
    gone.loop.stop()  # a process that stops
    assert client.get(PROCESSES.key("api-3:30")) is None

    totals = processes_breakers(client)
    assert totals["remote-a"] == {
        "inflight": 2,
        "processes": 2,
        "closed": 2,
        "half_open": 0,
        "open": 0,
    }
    assert totals["remote-b"]["processes"] == 2 and totals["remote-b"]["open"] == 2
    html = signed_in(staff).get(reverse("ops:panel", kwargs={"name": "backends"})).content.decode()
    row = html[html.index('data-backend="remote-a"') :]
    assert '<td data-figure="inflight">2</td>' in row[: row.index("</tr>")]

    settings.FAIRLANE_QUEUE_NAMESPACE = namespace + "other-"
    assert processes_breakers(client) == {}
    breakers.end("remote-a")


def test_the_spend_panel_adds_up_the_ledger_across_tenants(
    tenant, agent, other_tenant, other_agent, staff
):
    budget_create(tenant=tenant, agent=agent, limit_microcents=1_000)
    spend(tenant, agent, 900, model="tiny")
    spend(other_tenant, other_agent, 250_000_000, model="gpt", backend="openrouter")
    html = signed_in(staff).get(reverse("ops:panel", kwargs={"name": "spend"})).content.decode()
    assert '<strong data-figure="requests-day">2</strong>' in html
    assert '<strong data-figure="spend-day">$2.50</strong>' in html
    top = html[html.index("Top spenders") :]
    assert top.index("globex</a> · support-bot") < top.index("acme</a> · support-bot")
    assert 'data-route="openrouter/gpt"' in html and 'data-route="local/tiny"' in html
    assert 'data-budget="acme/support-bot"' in html and "90 %" in html
    assert 'id="ops-spend-chart"' in html


def test_a_tenants_page_shows_its_agents_against_their_budgets_and_its_alerts(
    tenant, agent, staff, django_capture_on_commit_callbacks
):
    budget_create(tenant=tenant, agent=agent, limit_microcents=1_000)
    with django_capture_on_commit_callbacks(execute=True):
        spend(tenant, agent, 850)
    html = signed_in(staff).get(reverse("ops:tenant", kwargs={"slug": "acme"})).content.decode()
    assert 'data-owner="support-bot"' in html and "85 %" in html
    assert 'data-alert="acme/threshold:80"' in html
    assert signed_in(staff).get(reverse("ops:tenant", kwargs={"slug": "nope"})).status_code == 404


def test_the_alerts_panel_lists_what_fired_for_whom_with_delivery_status(tenant, agent, staff):
    event = AlertEvent.objects.create(
        tenant=tenant,
        agent=agent,
        event="budget_crossed",
        rule="threshold:100",
        period="daily",
        window_start=timezone.now(),
        window_end=timezone.now() + timedelta(1),
        spent_microcents=10,
        limit_microcents=10,
        message="Agent support-bot's budget is spent",
        created_at=timezone.now(),
    )
    event.deliveries.create(
        tenant=tenant,
        kind="webhook",
        target="https://h.example/x",
        status="failed",
        attempts=8,
        next_attempt_at=timezone.now(),
        log=[{"ok": False, "status": 500, "error": "HTTP 500"}],
    )
    html = signed_in(staff).get(reverse("ops:panel", kwargs={"name": "alerts"})).content.decode()
    assert 'data-alert="acme/threshold:100"' in html and "budget_crossed" in html
    assert "webhook failed" in html and "8 attempts" in html and "HTTP 500" in html


def test_staff_set_the_platforms_destinations_and_see_a_webhook_secret_once(staff, settings):
    settings.FAIRLANE_ALERT_WEBHOOK_ALLOW_PRIVATE = False
    client = signed_in(staff)
    response = client.post(
        reverse("ops:alert_destination_add"),
        {"kind": "webhook", "target": "https://93.184.215.14/noc"},
    )
    assert response.status_code == 201 and "no-store" in response["Cache-Control"]
    secret = response.context["secret"]
    assert secret in response.content.decode()
    response = client.post(
        reverse("ops:alert_destination_add"), {"kind": "webhook", "target": "http://10.0.0.8/noc"}
    )
    assert response.status_code == 400
    assert "not on a public address" in response.content.decode()
    page = client.get(reverse("ops:alerts")).content.decode()
    assert "https://93.184.215.14/noc" in page and secret not in page
    destination = AlertDestination.objects.get()
    assert destination.tenant is None
    response = client.post(
        reverse("ops:alert_destination_remove", kwargs={"destination_id": destination.pk})
    )
    assert response.status_code == 302 and not AlertDestination.objects.exists()
    csrf = Client(enforce_csrf_checks=True)
    csrf.force_login(staff)
    assert (
        csrf.post(
            reverse("ops:alert_destination_add"), {"kind": "email", "target": "a@b.example"}
        ).status_code
        == 403
    )


def test_a_request_is_looked_up_by_its_id_or_its_trace_with_each_steps_duration(
    tenant, agent, other_tenant, other_agent, staff
):
    trace = uuid.uuid4().hex
    t0 = timezone.now().timestamp() - 2
    line = {
        "received": t0,
        "admitted": t0 + 0.004,
        "queued": t0 + 0.005,
        "lane": "realtime",
        "position": 3,
        "taken": t0 + 0.250,
        "worker": "gpu-7",
        "first_token": t0 + 0.300,
        "last_token": t0 + 1.300,
    }
    ids = []
    for who, where in ((tenant, agent), (other_tenant, other_agent)):  # one trace, 2 tenants
        request_id = uuid.uuid4().hex
        budget_reserve(tenant=who, agent=where, amount_microcents=10, request_id=request_id)
        budget_settle(
            tenant=who,
            request_id=request_id,
            cost_microcents=10,
            usage=Usage(backend="local", model="tiny", trace_id=trace, timeline=line),
        )
        ids.append(request_id)
    client = signed_in(staff)
    page = client.get(reverse("ops:requests"), {"q": ids[0]}).content.decode()
    assert page.count('data-request="') == 1 and ids[0] in page and trace in page
    steps = [s.split('"')[0] for s in page.split('data-step="')[1:]]
    assert steps == [
        "received",
        "admitted",
        "queued",
        "taken",
        "first_token",
        "last_token",
        "settled",
    ]
    assert "realtime lane, position 3" in page and "by worker gpu-7" in page
    assert "245.0 ms" in page and "1000.0 ms" in page  # queued -> taken; first -> last token
    # The trace id finds both of its requests, whichever tenant they belong to.
    page = client.get(reverse("ops:requests"), {"q": trace.upper()}).content.decode()
    assert page.count('data-request="') == 2 and all(i in page for i in ids)
    # Admitted and not settled yet: in flight, with what it holds.
    held = uuid.uuid4().hex
    budget_reserve(tenant=tenant, agent=agent, amount_microcents=77, request_id=held)
    page = client.get(reverse("ops:requests"), {"q": held}).content.decode()
    assert f'data-in-flight="{held}"' in page and "data-request=" not in page
    page = client.get(reverse("ops:requests"), {"q": "nope"}).content.decode()
    assert "No request or trace with that id." in page


def test_the_spend_panel_lists_the_budgets_past_their_soft_level(
    tenant, agent, other_tenant, other_agent, staff
):
    """Whoever is demoted or throttled now, across tenants, however little of its limit it
    has used; a budget below its soft level is not listed."""
    budget_create(
        tenant=tenant,
        agent=agent,
        limit_microcents=100_000,
        soft_limit_microcents=1_000,
        soft_action="demote",
    )
    budget_create(
        tenant=other_tenant,
        agent=other_agent,
        limit_microcents=100_000,
        soft_limit_microcents=50_000,
        soft_action="throttle",
        soft_rpm=10,
    )
    spend(tenant, agent, 1_500)  # 1.5 % of its limit, past its soft level
    spend(other_tenant, other_agent, 40_000)  # 40 %, below its soft level
    html = signed_in(staff).get(reverse("ops:panel", kwargs={"name": "spend"})).content.decode()
    crossed = html[html.index("Past their soft level") : html.index("Top spenders")]
    assert 'data-soft-crossed="acme/support-bot"' in crossed
    assert 'data-soft="demote"' in crossed and "demoted to the bulk lane" in crossed
    assert "globex" not in crossed
    nearest = html[html.index('data-budget="globex/support-bot"') :]
    nearest = nearest[: nearest.index("</tr>")]
    assert "throttle to 10/min" in nearest and "data-soft=" not in nearest
    spend(other_tenant, other_agent, 10_000)  # now at its soft level
    html = signed_in(staff).get(reverse("ops:panel", kwargs={"name": "spend"})).content.decode()
    crossed = html[html.index("Past their soft level") : html.index("Top spenders")]
    assert 'data-soft-crossed="globex/support-bot"' in crossed and 'data-soft="throttle"' in crossed
