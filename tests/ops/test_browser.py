"""The ops dashboard in a real browser (Chromium through Playwright) against uvicorn serving
the site and /v1 on the test database: an operator watches the figures move while clients
use the API with the official openai client; people who are not staff are refused. Pages are
saved under var/screenshots/ops/."""

import re
import threading
import uuid

import openai
import pytest
from playwright.sync_api import Page, expect

from tenants.models import Role
from tenants.services.alerts import alert_destination_add
from tenants.services.budgets import budget_create, budget_update
from tenants.services.keys import api_key_create
from tenants.services.tenancy import agent_create, member_add, tenant_create
from tests.conftest import ROOT, child_env
from tests.routing.conftest import PRICES
from tests.servers import AsgiServer
from workers.serving.registration import model_register

pytestmark = pytest.mark.django_db(transaction=True)
SHOTS = ROOT / "var" / "screenshots" / "ops"


@pytest.fixture(scope="module")
def live(django_db_setup, django_db_blocker):
    # Its own Redis namespace: counts other tests' servers shared there are not this one's.
    server = AsgiServer(
        child_env(
            FAIRLANE_ENGINE_MODE="embedded",
            FAIRLANE_OPS_POLL_SECONDS="1",
            FAIRLANE_ALERT_SWEEP_SECONDS="2",
            FAIRLANE_QUEUE_NAMESPACE=f"ops{uuid.uuid4().hex[:8]}-",
        )
    )
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def _no_csp_violations(page: Page):
    refused = []
    page.on(
        "console",
        lambda message: (
            refused.append(message.text) if "Content Security Policy" in message.text else None
        ),
    )
    yield
    assert not refused, refused


@pytest.fixture
def acme(make_user):
    owner = make_user("olivia")
    tenant = tenant_create(name="Acme", slug="acme", owner=owner)
    model_register(name="tiny", source="preset:tiny", **PRICES)
    model_register(name="small", source="preset:small", **PRICES)
    agent = agent_create(tenant=tenant, name="writer")
    budget = budget_create(tenant=tenant, agent=agent, limit_microcents=10**8)
    _, key = api_key_create(tenant=tenant, agent=agent, scopes=["inference"])
    return tenant, key, budget


def shot(page: Page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def sign_in(page: Page, live, username: str, then: str) -> None:
    page.goto(f"{live.url}/portal/login/?next={then}")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill("pw-" + username)
    page.get_by_role("button", name="Sign in").click()


def test_an_operator_sees_the_figures_move_under_load(live, acme, make_user, page: Page):
    tenant, key, budget = acme
    make_user("sam", is_staff=True)
    sign_in(page, live, "sam", "/ops/")
    expect(page.get_by_role("heading", name="Operations")).to_be_visible()
    local = page.locator("tr[data-backend=local]")
    expect(local.locator("[data-figure=attempts-5m]")).to_have_text("0")
    expect(page.locator("[data-figure=requests-hour]")).to_have_text("0")
    shot(page, "dashboard-idle")

    client = openai.OpenAI(api_key=key, base_url=live.url + "/v1", max_retries=0)
    for _ in range(3):
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=8
        )
    # the panels poll every second (spend every three): the figures follow, no reload
    expect(local.locator("[data-figure=attempts-5m]")).to_have_text("3", timeout=15_000)
    expect(page.locator("[data-figure=requests-hour]")).to_have_text("3", timeout=15_000)
    expect(
        page.locator("tr[data-route='embedded/tiny'] [data-figure=route-requests]")
    ).to_have_text("3")
    expect(page.locator("li[data-model=tiny] .badge").first).to_have_text("serving")
    # the chart of spend per backend and model is drawn again in each refreshed panel
    page.wait_for_function(
        "() => { const c = document.querySelector('#panel-spend canvas');"
        " return c && c._chart && c._chart.data.labels.length === 1; }",
        timeout=15_000,
    )

    # a long answer on the slower model: while it streams, it is in flight and running
    done = threading.Event()

    def long_answer():
        try:
            stream = client.chat.completions.create(
                model="small",
                messages=[{"role": "user", "content": "Tell a long story"}],
                max_tokens=400,
                stream=True,
                extra_body={"min_tokens": 400},
            )
            for _ in stream:
                pass
        finally:
            done.set()

    threading.Thread(target=long_answer, daemon=True).start()
    expect(local.locator("[data-figure=inflight]")).to_have_text("1", timeout=60_000)
    expect(page.locator("tr[data-engine=small] [data-figure=running]")).to_have_text("1")
    shot(page, "dashboard")
    assert done.wait(180)
    expect(local.locator("[data-figure=inflight]")).to_have_text("0", timeout=15_000)
    expect(page.locator("tr[data-engine=small] [data-figure=running]")).to_have_text("0")
    expect(page.locator("[data-figure=requests-hour]")).to_have_text("4", timeout=15_000)

    # an operator cuts the agent's budget below what it spent: the server's sweep fires its
    # alerts (the embedded mode has no beat), each once, and emails the tenant's recipient
    alert_destination_add(tenant=tenant, kind="email", target="ops@acme.example")
    budget_update(budget=budget, limit_microcents=1)
    alerts = page.locator("#panel-alerts")
    expect(alerts.locator("tr[data-alert='acme/threshold:100']")).to_contain_text(
        "budget_crossed", timeout=20_000
    )
    expect(alerts.locator("tr[data-alert='acme/threshold:100']")).to_contain_text(
        "email delivered", timeout=20_000
    )
    expect(alerts.locator("tr[data-alert]")).to_have_count(3)  # 50, 80 and 100 %, once each
    expect(page.locator("tr[data-budget='acme/writer']")).to_contain_text(
        "$0.00000001", timeout=15_000
    )
    expect(alerts.locator("tr[data-alert='acme/threshold:80']")).to_contain_text(
        re.compile(r"reached 80 % \(\$0\.\d+ of \$0\.00000001;")
    )
    shot(page, "dashboard-alerts")

    page.get_by_role("link", name="acme").first.click()
    expect(page.get_by_role("heading", name="Acme")).to_be_visible()
    expect(page.locator("tr[data-owner=writer]")).to_be_visible()
    shot(page, "tenant")

    # a request looked up by the x-request-id its client got: its steps, each timed
    budget_update(budget=budget, limit_microcents=10**8)
    raw = client.chat.completions.with_raw_response.create(
        model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=8
    )
    request_id = raw.headers["x-request-id"]
    page.get_by_role("link", name="Requests").click()
    page.get_by_label("Request id").fill(request_id)
    page.get_by_role("button", name="Look up").click()
    found = page.locator(f"section[data-request='{request_id}']")
    # the embedded mode has no fair queue: received, admitted, taken, in the engine, tokens,
    # settled
    expect(found.locator("tr[data-step]")).to_have_count(7)
    expect(found.locator("tr[data-step=submitted]")).to_contain_text("in the engine")
    expect(found.locator("tr[data-step=taken]")).to_contain_text("by worker embedded")
    expect(found).to_contain_text(raw.headers["x-fairlane-trace-id"])
    shot(page, "request")


def test_people_who_are_not_staff_are_refused(live, acme, make_user, page: Page):
    tenant, _, _ = acme
    page.goto(live.url + "/ops/")
    expect(page.get_by_label("Username")).to_be_visible()  # visitors: the sign-in page
    assert "/portal/login/" in page.url
    admin = make_user("ada")
    member_add(tenant=tenant, user=admin, role=Role.OWNER, actor_role=Role.OWNER)
    sign_in(page, live, "ada", "/ops/")
    expect(page.get_by_role("heading", name="Not allowed")).to_be_visible()
    expect(page.locator("main")).to_contain_text("for the platform's operators")
    for path in ("/ops/panels/spend/", "/ops/alerts/", "/ops/tenants/acme/"):
        response = page.goto(live.url + path)
        assert response.status == 403, path
    shot(page, "refused")
