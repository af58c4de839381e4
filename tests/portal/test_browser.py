"""The portal in a real browser (Chromium through Playwright) against a live server (uvicorn,
HTTP and the websocket, on the test database), with the official openai client inside the
test: the issue's whole story, a viewer, a stranger, and an exhausted budget. Each page is
saved as a screenshot under var/screenshots/portal/."""

import re
from pathlib import Path

import openai
import pytest
from playwright.sync_api import Page, expect

from routing.models import AgentRouting
from tenants.models import Budget, Role, Scope, UsageRecord
from tenants.services.budgets import budget_create
from tenants.services.keys import api_key_create
from tenants.services.tenancy import agent_create, member_add, tenant_create
from tests.conftest import ROOT, child_env
from tests.routing.conftest import PRICES
from tests.servers import AsgiServer
from workers.serving.registration import model_register

pytestmark = pytest.mark.django_db(transaction=True)
SHOTS = ROOT / "var" / "screenshots" / "portal"
KEY_RE = re.compile(r"^fl-[a-z0-9]{12}-[A-Za-z0-9]{43}$")


@pytest.fixture(scope="module")
def live(django_db_setup, django_db_blocker):
    """uvicorn serving the whole site (pages, /v1, /ws/v1/chat) with in-process engines."""
    server = AsgiServer(child_env(FAIRLANE_ENGINE_MODE="embedded"))
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def _no_csp_violations(page: Page):
    """Every page works under its Content-Security-Policy: the browser reports no script,
    style or connection it refused."""
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
    return tenant


def person(make_user, tenant, role: str, username: str):
    user = make_user(username)
    member_add(tenant=tenant, user=user, role=role, actor_role=Role.OWNER)
    return user


def shot(page: Page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def sign_in(page: Page, live, username: str) -> None:
    page.goto(live.url + "/portal/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill("pw-" + username)
    page.get_by_role("button", name="Sign in").click()


def nav(page: Page, name: str) -> None:
    """Follow a main navigation link, and wait until its page has loaded (a check made while
    the old page unloads finds no document)."""
    link = page.get_by_role("navigation", name="Main").get_by_role("link", name=name)
    href = link.get_attribute("href") or ""
    link.click()
    page.wait_for_url(lambda url: url.split("?")[0].endswith(href.split("?")[0]))


def test_the_members_story_from_sign_in_to_a_revoked_key(live, acme, make_user, page: Page):
    person(make_user, acme, Role.ADMIN, "ada")
    page.on("dialog", lambda dialog: dialog.accept())
    sign_in(page, live, "ada")
    expect(page.get_by_role("heading", name="Acme")).to_be_visible()
    shot(page, "overview-empty")

    # an agent with a budget
    nav(page, "Agents")
    page.get_by_role("link", name="New agent").click()
    page.get_by_label("Name", exact=True).fill("writer")
    page.get_by_label("Allowed models").fill("tiny, small")
    page.get_by_label("Budget (USD)").fill("1")
    shot(page, "agent-form")
    page.get_by_role("button", name="Create agent").click()
    row = page.locator("tr[data-agent=writer]")
    expect(row).to_contain_text("$1.00 daily")
    shot(page, "agents")

    # its routing, through the management API with the page's session
    row.get_by_role("link", name="Routing").click()
    expect(page.locator("#rt-status")).to_have_text("")
    expect(page.get_by_label("Policy")).to_have_value("chain")
    page.get_by_label("Policy").select_option("cost")
    page.get_by_role("button", name="Save routing").click()
    expect(page.locator("#rt-status")).to_have_text("Saved.")
    assert AgentRouting.objects.get(agent__name="writer").policy == "cost"
    page.get_by_label("Cascade threshold").fill("5")
    page.get_by_role("button", name="Save routing").click()
    expect(page.locator("#rt-status")).to_contain_text("cascade_threshold")  # the API's words
    assert AgentRouting.objects.get(agent__name="writer").cascade_threshold == -1.0
    shot(page, "routing")

    # a key, read from the page once
    nav(page, "Keys")
    page.get_by_label("Agent").select_option(label="writer")
    page.get_by_label("Name").fill("story")
    page.get_by_role("button", name="Create key").click()
    plain = page.get_by_label("Your new key").input_value()
    assert KEY_RE.match(plain)
    shot(page, "key-created")
    page.get_by_role("link", name=re.compile("back to keys")).click()
    expect(page.locator("body")).not_to_contain_text(plain)
    prefix = plain[:15]
    expect(page.locator(f"tr[data-key='{prefix}']")).to_contain_text("active")

    # the official client uses it
    client = openai.OpenAI(base_url=live.url + "/v1", api_key=plain, max_retries=0)
    answer = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Hello"}], max_tokens=8
    )
    request_id = answer.id.removeprefix("chatcmpl-")
    record = UsageRecord.objects.get(request_id=request_id)
    assert record.completion_tokens == answer.usage.completion_tokens > 0

    # ... and the request shows in the usage chart and table
    nav(page, "Usage")
    expect(page.locator("[data-figure=requests]")).to_have_text("1")
    expect(page.locator(f"tr[data-request='{request_id}']")).to_contain_text("tiny")
    page.get_by_label("Split by").select_option("key")
    page.get_by_role("button", name="Apply").click()
    expect(page).to_have_url(re.compile(r"[?&]split=key"))  # filters live in the URL
    # The new page may still be loading when the URL changes: wait until its chart is drawn.
    drawn = page.wait_for_function(
        "() => { const c = document.querySelector('canvas[data-chart]');"
        " return c && c._chart && c._chart.data.datasets"
        ".map(d => [d.label, d.data.reduce((a, b) => a + b, 0)]); }"
    ).json_value()
    assert drawn == [[prefix, record.cost_microcents / 100_000_000]]
    shot(page, "usage")
    with page.expect_download() as download:  # streamed by the ASGI server, filters kept
        page.get_by_role("link", name="Export CSV").click()
    exported = Path(download.value.path()).read_text().splitlines()
    assert exported[0].startswith("created_at,request_id,agent,key")
    assert len(exported) == 2 and request_id in exported[1] and prefix in exported[1]

    # the playground streams an answer, shows its tokens, latency and ledger cost ...
    nav(page, "Playground")
    page.get_by_label("Agent").select_option(label="writer")
    expect(page.locator("#pg-status")).to_have_text("Ready.")
    page.get_by_label("Model").select_option("tiny")
    # Max tokens is bounded by the model's context, less one prompt token (issue 28).
    from workers.serving.catalog import model_context_length, model_get

    context = model_context_length(model_get(name="tiny"))
    expect(page.get_by_label("Max tokens")).to_have_attribute("max", str(context - 1))
    page.get_by_label("Max tokens").fill("12")
    page.get_by_label("Message").fill("Tell me a story")
    page.get_by_role("button", name="Send").click()
    stats = page.locator(".msg.assistant .stats").first
    expect(stats).to_contain_text("completion tokens")
    expect(stats).to_contain_text("latency")
    expect(stats.locator(".cost")).to_contain_text("cost $", timeout=15_000)
    ledger = UsageRecord.objects.get(
        request_id=stats.locator(".cost").get_attribute("data-request")
    )
    assert ledger.model == "tiny" and ledger.status == "ok" and ledger.completion_tokens <= 12
    assert stats.locator(".cost").get_attribute("data-cost") == str(ledger.cost_microcents)
    # ... and cancels another
    page.get_by_label("Model").select_option("small")
    page.get_by_label("Max tokens").fill("1500")
    page.get_by_label("Message").fill("Go on and on")
    page.get_by_role("button", name="Send").click()
    second = page.locator(".msg.assistant").nth(1)
    expect(second.locator(".text")).not_to_be_empty(timeout=60_000)
    page.get_by_role("button", name="Cancel").click()
    expect(second.locator(".stats")).to_contain_text("Cancelled", timeout=30_000)
    expect(second.locator(".cost")).to_contain_text("ledger: cancelled", timeout=15_000)
    cancelled = UsageRecord.objects.get(status="cancelled")
    assert 0 < cancelled.completion_tokens < 1500
    shot(page, "playground")

    # rotate: the old key keeps working during the grace, then revoke it
    nav(page, "Keys")
    page.locator(f"tr[data-key='{prefix}']").get_by_role("combobox").select_option("3600")
    page.get_by_role("button", name=f"Rotate {prefix}").click()
    new_plain = page.get_by_label("Your new key").input_value()
    assert KEY_RE.match(new_plain) and new_plain != plain
    expect(page.locator("main")).to_contain_text(f"The old key {prefix} keeps working until")
    assert client.models.list().data  # old key, in its grace
    fresh = openai.OpenAI(base_url=live.url + "/v1", api_key=new_plain, max_retries=0)
    assert {m.id for m in fresh.models.list().data} == {"tiny", "small"}
    page.get_by_role("link", name=re.compile("back to keys")).click()
    expect(page.locator(f"tr[data-key='{prefix}']")).to_contain_text("in grace")
    page.get_by_role("button", name=f"Revoke {prefix}").click()
    expect(page.locator(f"tr[data-key='{prefix}']")).to_contain_text("revoked")
    shot(page, "keys")
    with pytest.raises(openai.AuthenticationError):
        client.models.list()
    assert fresh.models.list().data
    nav(page, "Overview")
    expect(page.locator("tr[data-owner=writer]")).to_contain_text("$1.00")
    shot(page, "overview")


def test_a_viewer_sees_everything_and_can_change_nothing(live, acme, make_user, page: Page):
    agent = agent_create(tenant=acme, name="writer")
    person(make_user, acme, Role.VIEWER, "vic")
    sign_in(page, live, "vic")
    for section in ["Overview", "Agents", "Budgets", "Keys", "Usage", "Members", "Playground"]:
        nav(page, section)
        expect(page.locator("main h1")).to_be_visible()
        shot(page, f"viewer-{section.lower()}")
    # on a phone, in the dark, by keyboard
    page.set_viewport_size({"width": 390, "height": 844})
    page.emulate_media(color_scheme="dark")
    nav(page, "Usage")
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    assert page.evaluate("getComputedStyle(document.body).backgroundColor") == "rgb(18, 22, 28)"
    shot(page, "viewer-phone-dark-usage")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Skip to content"
    page.set_viewport_size({"width": 1280, "height": 860})
    page.emulate_media(color_scheme="light")
    nav(page, "Keys")
    expect(page.get_by_role("button", name="Create key")).to_have_count(0)
    nav(page, "Agents")
    expect(page.get_by_role("link", name="New agent")).to_have_count(0)
    expect(page.get_by_role("button", name="Deactivate")).to_have_count(0)
    nav(page, "Playground")
    expect(page.locator("main")).to_contain_text("needs the member role")
    # the hidden buttons' actions, posted by hand from the page, are refused
    statuses = page.evaluate(
        """async (agentId) => {
        const csrf = document.cookie.match(/csrftoken=([^;]+)/)[1];
        const post = (path, data) => fetch(path, {method: "POST", headers: {"X-CSRFToken": csrf},
            body: new URLSearchParams(data)}).then(r => r.status);
        return [await post("/portal/t/acme/keys/new/", {agent: agentId, scopes: "inference"}),
                await post(`/portal/t/acme/agents/${agentId}/deactivate/`, {}),
                await post("/portal/t/acme/playground/key/", {agent: agentId})];
    }""",
        str(agent.pk),
    )
    assert statuses == [403, 403, 403]
    agent.refresh_from_db()
    assert agent.is_active and not agent.api_keys.exists()


def test_budgets_at_every_scope_are_made_in_the_browser_and_a_member_sees_hers(
    live, acme, make_user, page: Page
):
    """An admin adds a budget for an API key and some models, and one for a member, through
    the budgets page's form (a missing owner is shown on its field); the member then sees
    hers under "Your budgets" and cannot add one; the admin removes one."""
    agent = agent_create(tenant=acme, name="writer")
    person(make_user, acme, Role.ADMIN, "ada")
    mia = person(make_user, acme, Role.MEMBER, "mia")
    key, _ = api_key_create(tenant=acme, agent=agent, name="ci job", scopes=[Scope.INFERENCE])
    sign_in(page, live, "ada")
    nav(page, "Budgets")
    expect(page).to_have_title("Budgets · Acme · Fairlane")
    form = page.locator("#scoped-budgets form.row-form")
    form.get_by_label("For").select_option("api_key")
    form.get_by_label("Budget (USD)").fill("3")
    form.get_by_role("button", name="Add budget").click()
    expect(page.locator("#scoped-budgets")).to_contain_text("Choose the API key")
    form = page.locator("#scoped-budgets form.row-form")
    form.get_by_label("For").select_option("api_key")
    form.get_by_label("API key").select_option(label=f"{key.prefix} (writer, ci job)")
    form.get_by_label("Models").fill("small, tiny")
    form.get_by_label("Budget (USD)").fill("3")
    form.get_by_role("button", name="Add budget").click()
    rows = page.locator("#scoped-budgets tbody tr")
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text(f"API key {key.prefix} (models: small, tiny)")
    form = page.locator("#scoped-budgets form.row-form")
    form.get_by_label("For").select_option("member")
    form.get_by_label("Member", exact=True).select_option(label="mia")
    form.get_by_label("Budget (USD)").fill("1.5")
    form.get_by_role("button", name="Add budget").click()
    expect(rows).to_have_count(2)
    shot(page, "budgets-scoped")
    budget = Budget.objects.get(tenant=acme, member__user=mia)
    assert budget.limit_microcents == 150_000_000 and budget.scope == "member"
    assert Budget.objects.get(tenant=acme, api_key=key).model_names == ["small", "tiny"]
    page.get_by_role(
        "button", name=f"Remove the budget of API key {key.prefix} (models: small, tiny)"
    ).click()
    expect(rows).to_have_count(1)
    assert not Budget.objects.filter(api_key=key).exists()
    # mia made no key yet: give her one, then she sees her budget and no form.
    api_key_create(tenant=acme, agent=agent, created_by=mia, scopes=[Scope.INFERENCE])
    page.context.clear_cookies()
    sign_in(page, live, "mia")
    nav(page, "Budgets")
    expect(page.locator("#my-budgets")).to_contain_text("member mia")
    expect(page.get_by_role("button", name="Add budget")).to_have_count(0)
    shot(page, "budgets-member")


def test_a_member_of_another_tenant_gets_404(live, acme, make_user, page: Page):
    agent = agent_create(tenant=acme, name="writer")
    stranger = make_user("oscar")
    tenant_create(name="Globex", slug="globex", owner=stranger)
    sign_in(page, live, "oscar")
    expect(page.get_by_role("heading", name="Globex")).to_be_visible()
    for path in ["", "keys/", "usage/", f"agents/{agent.pk}/", "playground/"]:
        response = page.goto(f"{live.url}/portal/t/acme/{path}")
        assert response.status == 404, path
        expect(page.get_by_role("heading", name="Not found")).to_be_visible()
    shot(page, "stranger-404")


def test_an_exhausted_budget_shows_the_banner_and_every_page_still_loads(
    live, acme, make_user, page: Page
):
    agent = agent_create(tenant=acme, name="writer", allowed_models=["tiny"])
    budget_create(tenant=acme, agent=None, limit_microcents=0)
    budget_create(tenant=acme, agent=agent, limit_microcents=10**8)
    person(make_user, acme, Role.MEMBER, "max")
    sign_in(page, live, "max")
    for section in ["Overview", "Agents", "Budgets", "Keys", "Usage", "Members", "Playground"]:
        nav(page, section)
        banner = page.locator(".banner.error")
        expect(banner).to_contain_text("The tenant's daily budget is spent")
        shot(page, f"exhausted-{section.lower()}")
    expect(page.locator("#pg-status")).to_have_text("Ready.")
    page.get_by_label("Message").fill("Anything?")
    page.get_by_role("button", name="Send").click()
    expect(page.locator(".msg.assistant .stats")).to_contain_text("budget cannot cover")
    assert not UsageRecord.objects.exists()
