"""The /v1 API's OpenAPI 3.1 document (routing/openapi/) is valid, covers every route
routing/urls.py serves, and describes the API as it answers: schemathesis (pinned, every
check, seeded, a bounded number of examples per operation) runs over it against a live server
in the embedded mode with the `tiny` model and a real key, and finds nothing."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from django.urls import URLPattern, get_resolver
from openapi_spec_validator import OpenAPIV31SpecValidator

from routing import urls as v1_urls
from routing.openapi import document
from routing.openapi.common import STATUSES
from tenants.errors import ApplicationError, ServiceUnavailable, _all_subclasses
from tenants.models import Scope
from tenants.services.keys import api_key_create
from tests.conftest import child_env
from tests.servers import AsgiServer
from workers.engine.tokenizer import PRESET_VOCAB_SIZE
from workers.serving.registration import model_register

SEED = 20261205
MAX_EXAMPLES = 60
HOOKS = Path(__file__).with_name("v1_schema_hooks.py")
CONFIG = r"""
# A prompt longer than the model's context is a 400 to a schema-valid request (see the hooks).
hooks = "{hooks}"

# Every generated request names the served model and asks for two tokens: the document's
# bounds are the API's (max_tokens up to 10,000,000, which the model's context then limits),
# the run's are small enough to take a minute or two.
[parameters]
"body.model" = "tiny"
"body.max_tokens" = 2
"body.max_completion_tokens" = 2
"body.max_output_tokens" = 2
"""


def _path(pattern) -> str:
    """A route of routing/urls.py as the document writes it: `<path:model_id>` -> `{model}`,
    `<str:file_id>` -> `{file_id}` (OpenAI's names)."""
    return "/" + re.sub(
        r"<(?:\w+:)?(\w+)>",
        lambda m: "{model}" if m[1] == "model_id" else "{" + m[1] + "}",
        str(pattern.pattern),
    )


def test_the_document_is_valid_openapi_31():
    errors = list(OpenAPIV31SpecValidator(document()).iter_errors())
    assert not errors, [f"{'/'.join(map(str, e.path))}: {e.message[:300]}" for e in errors]


def test_every_v1_route_is_documented_with_its_method():
    routes = {_path(p): p.callback for p in v1_urls.urlpatterns if isinstance(p, URLPattern)}
    assert set(routes) == set(document()["paths"]), (sorted(routes), sorted(document()["paths"]))
    for path, operations in document()["paths"].items():
        methods = {m for m in operations if m in {"get", "post", "put", "patch", "delete"}}
        assert methods, path
        # openai_view("GET", "POST") answers every other method 405: the documented ones are
        # its own (a path such as /files has two, told apart by the view).
        answer = get_resolver().resolve("/v1" + path.replace("{model}", "tiny"))
        assert answer.func is routes[path], path


def test_every_error_code_documented_is_one_the_api_has():
    known = {cls.code for cls in _all_subclasses(ApplicationError)} | {"model_not_found"}
    named = {code for _, codes in STATUSES.values() for code in codes}
    assert named <= known | {ServiceUnavailable.code}, named - known


def _narrowed(schema: dict) -> dict:
    """The document as the test server's deployment serves it: the `tiny` model's vocabulary
    (token ids up to 260, in prompts and logit_bias) and no backend taking images. The server
    refuses what lies outside
    (a 400), so schemathesis's negative cases stay negative."""
    schema = json.loads(json.dumps(schema))
    components = schema["components"]["schemas"]
    for name in ("CreateCompletionRequest", "CreateEmbeddingRequest"):
        field = components[name]["properties"]["prompt" if "Completion" in name else "input"]
        token_ids = field["anyOf"][1]
        token_ids["items"]["maximum"] = PRESET_VOCAB_SIZE - 1
        field["anyOf"][2]["items"]["anyOf"][1] = token_ids
    for name in ("CreateCompletionRequest", "CreateChatCompletionRequest"):
        bias = components[name]["properties"]["logit_bias"]  # ids up to 260, 10 digits
        bias["propertyNames"]["pattern"] = (
            "^(?:0{0,8}[0-9]{1,2}|0{0,7}(?:1[0-9]{2}|2[0-5][0-9]|260))$"
        )
    chat = components["CreateChatCompletionRequest"]["properties"]
    user = next(
        m
        for m in chat["messages"]["items"]["oneOf"]
        if m["properties"]["role"].get("const") == "user"
    )
    user["properties"]["content"]["anyOf"][1]["items"]["anyOf"].pop(1)  # image parts
    for name in ("CreateMessageRequest", "CountMessageTokensRequest"):
        _without_images(components[name])  # Anthropic's image blocks
    items = components["CreateResponseRequest"]["properties"]["input"]["anyOf"][1]["items"]
    user = items["anyOf"][0]["properties"]["content"]["anyOf"][1]
    user["items"] = user["items"]["anyOf"][0]  # input_text parts only
    return schema


def _without_images(schema) -> None:
    """Drop image blocks (`type: image`) from every list of alternatives under `schema`."""
    if isinstance(schema, list):
        for item in schema:
            _without_images(item)
    elif isinstance(schema, dict):
        alternatives = schema.get("anyOf")
        if isinstance(alternatives, list):
            schema["anyOf"] = [
                a for a in alternatives if a.get("properties", {}).get("type") != {"const": "image"}
            ]
        for value in schema.values():
            _without_images(value)


@pytest.mark.django_db(transaction=True)
def test_schemathesis_finds_nothing(tenant, agent, tmp_path, capsys):
    model_register(name="tiny", source="preset:tiny")
    _, key = api_key_create(
        tenant=tenant, agent=agent, name="schemathesis", scopes=[Scope.INFERENCE]
    )
    (tmp_path / "schemathesis.toml").write_text(CONFIG.format(hooks=HOOKS))
    server = AsgiServer(child_env(FAIRLANE_ENGINE_MODE="embedded"))
    try:
        served = httpx.get(f"{server.url}/v1/openapi.json", timeout=30)
        assert served.status_code == 200 and served.json() == document()
        (tmp_path / "v1.json").write_text(json.dumps(_narrowed(served.json())))
        result = subprocess.run(
            [
                str(Path(sys.executable).parent / "schemathesis"),
                "--config-file",
                str(tmp_path / "schemathesis.toml"),
                "run",
                str(tmp_path / "v1.json"),
                "--url",
                f"{server.url}/v1",
                "--checks",
                "all",
                "--seed",
                str(SEED),
                "--max-examples",
                str(MAX_EXAMPLES),
                "--workers",
                "1",
                "--no-color",
                "--request-timeout",
                "60",
                "--report",
                "har",
                "--report-dir",
                str(tmp_path),
                "--header",
                f"Authorization: Bearer {key}",
            ],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=tmp_path,
        )
    finally:
        server.stop()
    output = result.stdout + result.stderr
    (tmp_path / "schemathesis.out").write_text(output)  # kept for a look after a failure
    assert result.returncode == 0, output[-20000:]
    summary = re.search(r"(\d+) generated, (\d+) passed", output)
    assert summary and summary[1] == summary[2] and int(summary[1]) > 1000, output[-3000:]
    # The cases reached the engine: each operation answered 200, streamed ones too.
    answered = _answers(next(tmp_path.glob("har-*.json")))
    with capsys.disabled():
        print(
            f"\n[schemathesis] /v1: {summary[1]} cases, all passed; 200s by path and type: "
            f"{answered}"
        )
    assert {
        ("/messages", "application/json"),  # its streams: tests/routing/test_messages_api.py
        ("/messages/count_tokens", "application/json"),
        ("/chat/completions", "text/event-stream"),
        ("/completions", "text/event-stream"),
        ("/chat/completions", "application/json"),
        ("/completions", "application/json"),
        ("/embeddings", "application/json"),
        ("/models", "application/json"),
        ("/models/tiny", "application/json"),
        ("/responses", "text/event-stream"),
        ("/responses", "application/json"),
        ("/files", "application/json"),
        ("/files/{file_id}", "application/json"),
        ("/files/{file_id}/content", "application/octet-stream"),
        ("/batches", "application/json"),
    } <= set(answered), answered


def _answers(har: Path) -> dict[tuple[str, str], int]:
    """How many 200s each path answered, by media type, in schemathesis's HAR report."""
    answers: dict[tuple[str, str], int] = {}
    for entry in json.loads(har.read_text())["log"]["entries"]:
        if entry["response"]["status"] == 200:
            key = (
                # A file's or batch's id as the document's parameter, so each path counts once.
                re.sub(
                    r"/(file-|batch_)[0-9a-f]+",
                    lambda m: "/{file_id}" if m[1] == "file-" else "/{batch_id}",
                    entry["request"]["url"].split("/v1", 1)[1].split("?")[0],
                ),
                entry["response"]["content"]["mimeType"].split(";")[0],
            )
            answers[key] = answers.get(key, 0) + 1
    return answers


def test_the_document_and_its_swagger_ui_are_public(client):
    served = client.get("/v1/openapi.json")
    assert served.status_code == 200 and served["Content-Type"] == "application/json"
    assert served.json() == json.loads(json.dumps(document()))
    page = client.get("/api/docs/v1/")
    assert page.status_code == 200 and b"/v1/openapi.json" in page.content
    # The management API's schema documents the management API only.
    paths = client.get("/api/schema/?format=json").json()["paths"]
    assert not [path for path in paths if "docs" in path or path.startswith("/v1/")], paths
