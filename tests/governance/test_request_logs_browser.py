"""Request logs in a real browser (Chromium through Playwright) against a live server (uvicorn,
its own engines, on the test database), with the official openai client: an admin turns them
on, a request's prompt and answer show on its page (redacted), an export downloads them, and
deleting them all empties the page; a member never sees the page."""

import json
from pathlib import Path

import openai
import pytest
from playwright.sync_api import Page, expect

from tenants.models import RequestLog, Role, Scope
from tenants.services.keys import api_key_create
from tenants.services.tenancy import agent_create, member_add, tenant_create
from tests.conftest import child_env
from tests.routing.conftest import PRICES
from tests.servers import AsgiServer
from workers.serving.registration import model_register

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(scope="module")
def live(django_db_setup, django_db_blocker):
    server = AsgiServer(child_env(FAIRLANE_ENGINE_MODE="embedded"))
    yield server
    server.stop()


def sign_in(page: Page, live, username: str) -> None:
    page.goto(live.url + "/portal/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill("pw-" + username)
    page.get_by_role("button", name="Sign in", exact=True).click()


def main_nav(page: Page):
    return page.get_by_role("navigation", name="Main")


def test_an_admin_keeps_reads_exports_and_deletes_request_logs(live, make_user, page: Page):
    tenant = tenant_create(name="Acme", slug="acme", owner=make_user("olivia"))
    model_register(name="tiny", source="preset:tiny", **PRICES)
    for username, role in (("ada", Role.ADMIN), ("max", Role.MEMBER)):
        member_add(tenant=tenant, user=make_user(username), role=role, actor_role=Role.OWNER)
    agent = agent_create(tenant=tenant, name="writer")
    _, plain = api_key_create(tenant=tenant, agent=agent, scopes=[Scope.INFERENCE])
    page.on("dialog", lambda dialog: dialog.accept())

    sign_in(page, live, "ada")
    main_nav(page).get_by_role("link", name="Request logs").click()
    expect(page.get_by_label("Keep the prompt and answer of requests")).not_to_be_checked()
    page.get_by_label("Keep the prompt and answer of requests").check()
    page.get_by_label("Keep them for (days)").fill("3")
    page.get_by_role("button", name="Save").click()
    expect(page.get_by_label("Keep the prompt and answer of requests")).to_be_checked()

    client = openai.OpenAI(base_url=live.url + "/v1", api_key=plain, max_retries=0)
    answer = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Hello from ada@acme.example"}],
        max_tokens=6,
        temperature=0,
    )
    request_id = answer.id.removeprefix("chatcmpl-")
    row = page.get_by_role("link", name=request_id)
    for _ in range(50):  # the log follows the answer: reload until it is listed
        page.reload()
        if row.count():
            break
        page.wait_for_timeout(100)
    row.click()
    prompt = page.get_by_role("region", name="Prompt")
    expect(prompt).to_contain_text("Hello from [REDACTED:email]")
    expect(prompt).not_to_contain_text("ada@acme.example")
    expect(page.get_by_role("region", name="Answer")).to_contain_text(
        answer.choices[0].message.content or ""
    )

    page.get_by_role("link", name="All request logs").click()
    with page.expect_download() as download:
        page.get_by_role("link", name="Export JSONL").click()
    [line] = [json.loads(x) for x in Path(download.value.path()).read_text().splitlines()]
    assert line["request_id"] == request_id and line["output"][0]["text"]

    page.get_by_role("button", name="Delete all request logs").click()
    expect(page.get_by_text("1 request log deleted.")).to_be_visible()
    expect(page.get_by_role("link", name=request_id)).to_have_count(0)
    assert not RequestLog.objects.exists()

    page.context.clear_cookies()
    sign_in(page, live, "max")
    expect(main_nav(page).get_by_role("link", name="Keys")).to_be_visible()
    expect(main_nav(page).get_by_role("link", name="Request logs")).to_have_count(0)
    refused = page.goto(live.url + "/portal/t/acme/request-logs/")
    assert refused is not None and refused.status == 403
