"""The portal's batches page: a tenant's batches with their progress, cost so far and files,
and cancel (members and up; a viewer sees no button and is refused). Another tenant's batch
and files are not found. The browser story runs against a live server with the official
openai client uploading the input."""

import io
import json
from datetime import timedelta

import openai
import pytest
from django.utils import timezone
from playwright.sync_api import Page, expect

from routing.batch_models import Batch, BatchStatus, StoredFile
from routing.batches.validate import line_key
from tenants.models import Role, Scope, UsageRecord
from tenants.services.keys import api_key_create
from tests.conftest import child_env
from tests.routing.conftest import PRICES
from tests.servers import AsgiServer
from workers.serving.registration import model_register

pytestmark = pytest.mark.django_db(transaction=True)


def _batch(tenant, agent, *, status=BatchStatus.IN_PROGRESS, input_file=None) -> Batch:
    now = timezone.now()
    return Batch.objects.create(
        tenant=tenant,
        agent=agent,
        endpoint="/v1/chat/completions",
        input_file=input_file,
        status=status,
        total=10,
        completed=3,
        failed=1,
        created_at=now,
        expires_at=now + timedelta(hours=24),
    )


def _charged(batch: Batch, cost: int) -> None:
    UsageRecord.objects.create(
        request_id=line_key(batch_id=batch.id, custom_id="a") + "-1",
        tenant=batch.tenant,
        agent=batch.agent,
        cost_microcents=cost,
        created_at=timezone.now(),
    )


def test_the_page_lists_progress_and_cost_and_a_member_cancels(portal_client, tenant, agent):
    batch = _batch(tenant, agent)
    _charged(batch, 250_000)  # $0.0025
    client, _ = portal_client(Role.MEMBER)
    page = client.get(f"/portal/t/{tenant.slug}/batches/")
    assert page.status_code == 200
    body = page.content.decode()
    assert batch.id in body and "4 / 10" in body and "$0.002500" in body
    assert f"Cancel {batch.id}" in body
    response = client.post(f"/portal/t/{tenant.slug}/batches/{batch.id}/cancel/")
    assert response.status_code == 302
    assert Batch.objects.get(pk=batch.pk).status == BatchStatus.CANCELLING


def test_a_viewer_sees_no_cancel_and_is_refused(portal_client, tenant, agent):
    batch = _batch(tenant, agent)
    client, _ = portal_client(Role.VIEWER)
    assert (
        f"Cancel {batch.id}" not in client.get(f"/portal/t/{tenant.slug}/batches/").content.decode()
    )
    assert client.post(f"/portal/t/{tenant.slug}/batches/{batch.id}/cancel/").status_code == 403
    assert Batch.objects.get(pk=batch.pk).status == BatchStatus.IN_PROGRESS


def test_another_tenants_batch_and_files_are_not_found(
    portal_client, tenant, other_tenant, other_agent
):
    theirs = _batch(other_tenant, other_agent)
    client, _ = portal_client(Role.ADMIN)
    assert theirs.id not in client.get(f"/portal/t/{tenant.slug}/batches/").content.decode()
    assert client.post(f"/portal/t/{tenant.slug}/batches/{theirs.id}/cancel/").status_code == 404
    assert Batch.objects.get(pk=theirs.pk).status == BatchStatus.IN_PROGRESS
    assert client.get(f"/portal/t/{tenant.slug}/files/file-nope/").status_code == 404


@pytest.fixture(scope="module")
def live(django_db_setup, django_db_blocker, tmp_path_factory):
    """The whole site, its batch runner off so that a batch stays where the test puts it."""
    server = AsgiServer(
        child_env(
            FAIRLANE_ENGINE_MODE="embedded",
            FAIRLANE_BATCH_RUNNER="false",
            FAIRLANE_FILES_DIR=str(tmp_path_factory.mktemp("files")),
        )
    )
    yield server
    server.stop()


def test_a_member_follows_and_cancels_a_batch_in_the_browser(
    live, tenant, agent, member_of, page: Page
):
    model_register(name="tiny", source="preset:tiny", **PRICES)
    key = api_key_create(tenant=tenant, agent=agent, scopes=[Scope.INFERENCE])[1]
    api = openai.OpenAI(api_key=key, base_url=live.url + "/v1", max_retries=0)
    line = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {}}
    uploaded = api.files.create(
        file=("nightly.jsonl", io.BytesIO(json.dumps(line).encode() + b"\n")), purpose="batch"
    )
    batch = _batch(tenant, agent, input_file=StoredFile.objects.get(pk=uploaded.id))
    _charged(batch, 1_000_000)
    member_of(tenant, Role.MEMBER, "mia")
    page.on("dialog", lambda dialog: dialog.accept())
    page.goto(live.url + "/portal/login/")
    page.get_by_label("Username").fill("mia")
    page.get_by_label("Password").fill("pw-mia")
    page.get_by_role("button", name="Sign in").click()
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Batches").click()
    row = page.locator(f"tr[data-batch={batch.id}]")
    expect(row).to_contain_text("in_progress")
    expect(row).to_contain_text("4 / 10")
    expect(row).to_contain_text("$0.010000")
    with page.expect_download() as download:
        row.get_by_role("link", name="input").click()
    assert download.value.suggested_filename == "nightly.jsonl"
    row.get_by_role("button", name=f"Cancel {batch.id}").click()
    expect(page.locator(f"tr[data-batch={batch.id}]")).to_contain_text("cancelling")
    expect(page.get_by_role("button", name=f"Cancel {batch.id}")).to_have_count(0)
    assert Batch.objects.get(pk=batch.pk).status == BatchStatus.CANCELLING
