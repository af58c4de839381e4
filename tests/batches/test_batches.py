"""/v1/batches with the official `openai` client against a live server in the embedded mode:
its runner takes each batch through OpenAI's states and runs the lines as ordinary requests of
the agent (bulk lane, budget, ledger), each charged once at the batch price."""

import io
import json
import time

import httpx
import openai
import pytest

from routing.batch_models import Batch
from tenants.models import Lane, Scope, UsageRecord
from tenants.services.budgets import budget_create
from tenants.services.keys import api_key_create

pytestmark = pytest.mark.django_db(transaction=True)


def _line(i: int, model: str = "tiny", **body) -> dict:
    return {
        "custom_id": f"req-{i}",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {
            "model": model,
            "messages": [{"role": "user", "content": f"Say {i}"}],
            "max_tokens": 4,
            "temperature": 0,
            **body,
        },
    }


def _upload(client, lines: list) -> str:
    data = "".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines)
    return client.files.create(file=("in.jsonl", io.BytesIO(data.encode())), purpose="batch").id


def _create(client, file_id: str, endpoint: str = "/v1/chat/completions"):
    return client.batches.create(
        input_file_id=file_id,
        endpoint=endpoint,
        completion_window="24h",
        metadata={"job": "nightly"},
    )


def _until_at_rest(client, batch_id: str, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        batch = client.batches.retrieve(batch_id)
        if batch.status in ("completed", "failed", "expired", "cancelled"):
            return batch
        time.sleep(0.2)
    raise AssertionError(f"batch {batch_id} still {batch.status}")


def _jsonl(client, file_id: str | None) -> list[dict]:
    if file_id is None:
        return []
    return [json.loads(x) for x in client.files.content(file_id).read().splitlines()]


def test_a_batch_runs_each_line_once_at_the_batch_price(client, budget):
    batch = _create(client, _upload(client, [_line(i) for i in range(6)]))
    assert batch.status == "validating" and batch.metadata == {"job": "nightly"}
    done = _until_at_rest(client, batch.id)
    assert done.status == "completed", done
    assert (done.request_counts.total, done.request_counts.completed) == (6, 6)
    assert done.in_progress_at and done.finalizing_at and done.completed_at
    outputs = _jsonl(client, done.output_file_id)
    assert sorted(o["custom_id"] for o in outputs) == [f"req-{i}" for i in range(6)]
    for output in outputs:
        assert output["error"] is None and output["response"]["status_code"] == 200
        assert output["response"]["body"]["object"] == "chat.completion"
    assert done.error_file_id is None
    assert client.files.retrieve(done.output_file_id).purpose == "batch_output"
    # One ledger row per line, carrying the batch id, at half the model's prices.
    rows = UsageRecord.objects.filter(request_id__startswith=batch.id + "-")
    assert rows.count() == 6
    assert {r.request_id for r in rows} == {o["response"]["request_id"] for o in outputs}
    for row in rows:
        full = row.prompt_tokens * 10_000_000 + row.completion_tokens * 40_000_000
        assert row.cost_microcents == -(-(full // 2) // 1_000_000)
        assert row.timeline.get("lane", Lane.BULK) == Lane.BULK
    assert [b.id for b in client.batches.list()] == [batch.id]


def test_embeddings_batch(client):
    lines = [
        {
            "custom_id": f"e{i}",
            "method": "POST",
            "url": "/v1/embeddings",
            # A NUL in a prompt (and in answers of the random-weight model): kept as text.
            "body": {"model": "tiny", "input": f"text \u0000 {i}"},
        }
        for i in range(3)
    ]
    done = _until_at_rest(client, _create(client, _upload(client, lines), "/v1/embeddings").id)
    assert done.status == "completed", done
    outputs = _jsonl(client, done.output_file_id)
    assert all(o["response"]["body"]["object"] == "list" for o in outputs)


def test_responses_batch_runs_each_line_once_and_stores_what_asks_to_be_stored(client):
    lines = [
        {
            "custom_id": f"r{i}",
            "method": "POST",
            "url": "/v1/responses",
            "body": {
                "model": "tiny",
                "input": f"hello {i}",
                "max_output_tokens": 4,
                "store": i == 0,
            },
        }
        for i in range(3)
    ]
    done = _until_at_rest(client, _create(client, _upload(client, lines), "/v1/responses").id)
    assert done.status == "completed", done
    assert done.request_counts.completed == 3 and done.request_counts.failed == 0
    outputs = {o["custom_id"]: o for o in _jsonl(client, done.output_file_id)}
    assert set(outputs) == {"r0", "r1", "r2"}
    bodies = {k: o["response"]["body"] for k, o in outputs.items()}
    assert all(
        b["object"] == "response" and b["usage"]["output_tokens"] >= 1 for b in bodies.values()
    )
    rows = UsageRecord.objects.filter(request_id__startswith=done.id + "-")
    assert rows.count() == 3
    assert client.responses.retrieve(bodies["r0"]["id"]).id == bodies["r0"]["id"]
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(bodies["r1"]["id"])


def test_malformed_lines_fail_the_batch_naming_them(client):
    lines = [_line(0), "{not json", _line(2, max_tokens=-3), {**_line(3), "url": "/v1/x"}]
    done = _until_at_rest(client, _create(client, _upload(client, lines)).id)
    assert done.status == "failed" and done.failed_at
    errors = {e.line: e for e in done.errors.data}
    assert set(errors) == {2, 3, 4}
    assert errors[2].code == "invalid_json_line"
    assert errors[3].param == "body.max_tokens"
    assert errors[4].param == "url"
    assert not UsageRecord.objects.exists()


def test_an_unknown_model_fails_validation(client):
    done = _until_at_rest(client, _create(client, _upload(client, [_line(0, "gpt-9")])).id)
    assert done.status == "failed"
    assert done.errors.data[0].code == "model_not_found" and done.errors.data[0].line == 1


def test_another_tenants_file_and_batch_are_not_found(
    client, batch_server, other_tenant, other_agent
):
    file_id = _upload(client, [_line(0)])
    other_key = api_key_create(tenant=other_tenant, agent=other_agent, scopes=[Scope.INFERENCE])[1]
    other = openai.OpenAI(api_key=other_key, base_url=batch_server.url + "/v1", max_retries=0)
    with pytest.raises(openai.NotFoundError):
        _create(other, file_id)
    batch = _create(client, file_id)
    for call in (other.batches.retrieve, other.batches.cancel):
        with pytest.raises(openai.NotFoundError):
            call(batch.id)
    assert list(other.batches.list()) == []
    assert _until_at_rest(client, batch.id).status == "completed"


def test_a_cancelled_batch_answers_the_rest_as_cancelled(client):
    batch = _create(client, _upload(client, [_line(i, max_tokens=16) for i in range(40)]))
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status == "cancelling" and cancelling.cancelling_at
    done = _until_at_rest(client, batch.id)
    assert done.status == "cancelled" and done.cancelled_at
    outputs = _jsonl(client, done.output_file_id)
    errors = _jsonl(client, done.error_file_id)
    assert len(outputs) + len(errors) == done.request_counts.total
    assert {e["error"]["code"] for e in errors} <= {"batch_cancelled"}
    ledger = UsageRecord.objects.filter(request_id__startswith=batch.id + "-").count()
    assert ledger == len(outputs)
    with pytest.raises(openai.BadRequestError):
        client.batches.cancel(batch.id)


def test_budget_running_out_mid_batch(client, tenant, agent):
    # Room for a few lines at the batch price, not for twenty.
    budget_create(tenant=tenant, agent=agent, limit_microcents=400)
    done = _until_at_rest(
        client, _create(client, _upload(client, [_line(i) for i in range(20)])).id
    )
    assert done.status == "completed", done
    outputs, errors = _jsonl(client, done.output_file_id), _jsonl(client, done.error_file_id)
    assert outputs and errors
    assert len(outputs) + len(errors) == 20
    assert {e["error"]["code"] for e in errors} == {"budget_exhausted"}
    assert done.request_counts.completed == len(outputs)
    assert done.request_counts.failed == len(errors)
    rows = UsageRecord.objects.filter(request_id__startswith=done.id + "-")
    assert rows.count() == len(outputs)
    assert sum(r.cost_microcents for r in rows) <= 400


def test_bad_create_requests_are_400s(client):
    file_id = _upload(client, [_line(0)])
    with pytest.raises(openai.BadRequestError) as refused:
        client.batches.create(input_file_id=file_id, endpoint="/v1/images", completion_window="24h")
    assert refused.value.body["param"] == "endpoint"
    with pytest.raises(openai.BadRequestError):
        client.batches.create(
            input_file_id=file_id, endpoint="/v1/completions", completion_window="1h"
        )
    assert not Batch.objects.exists()


def test_ids_and_metadata_with_a_nul_are_refused_not_a_500(client, batch_server, key):
    """PostgreSQL's text holds no NUL: an id with one names no row (404) and metadata with one
    cannot be stored (400). Each reached a query and was a 500 (found by schemathesis)."""
    headers = {"Authorization": f"Bearer {key}"}
    base = batch_server.url + "/v1"
    with httpx.Client(headers=headers, timeout=30) as http:
        for path in ("/files/a%00b", "/files/a%00b/content", "/batches/a%00b", "/responses/a%00b"):
            got = http.get(base + path)
            assert got.status_code == 404, (path, got.text)
            assert {"message", "type", "code"} <= set(got.json()["error"])
        assert http.get(base + "/files", params={"after": "a\x00"}).status_code == 404
        assert http.get(base + "/batches", params={"after": "a\x00"}).status_code == 404
        body = {"endpoint": "/v1/embeddings", "completion_window": "24h"}
        missing = http.post(base + "/batches", json={**body, "input_file_id": "file\x00"})
        assert missing.status_code == 404, missing.text
        uploaded = client.files.create(file=("in.jsonl", io.BytesIO(b"{}\n")), purpose="batch")
        refused = http.post(
            base + "/batches",
            json={**body, "input_file_id": uploaded.id, "metadata": {"k": "v\x00"}},
        )
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "metadata"
    assert not Batch.objects.exists()
