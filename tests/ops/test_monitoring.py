"""The Grafana dashboard and the Prometheus alert rules in deploy/ are well formed, and every
metric they query is one /metrics exports, with the labels they select and group on (scraped
after real activity: a settlement crossing a budget alert, an email delivered, a request's
tokens timed, the embedded engine loaded, the fair queue in Redis)."""

import json
import re
import uuid

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from routing.breaker import breakers
from routing.metrics import ROUTE_ATTEMPTS, ROUTE_TTFT, TokenTimer
from routing.models import Backend
from routing.overload import load_admit
from tenants.errors import Overloaded
from tenants.models import AlertDelivery
from tenants.services.alerts import alert_deliveries_send_due, alert_destination_add
from tenants.services.alerts.evaluate import rules_cache_clear
from tenants.services.budgets import budget_create, budget_reserve
from tenants.services.ledger import Usage, budget_settle
from tests.conftest import ROOT, wait_for
from workers.serving.catalog import model_get
from workers.serving.events import Tokens
from workers.serving.request_times import request_times_observe
from workers.transport import queue_for

pytestmark = pytest.mark.django_db(transaction=True)
RULES = ROOT / "deploy" / "prometheus" / "fairlane-rules.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "fairlane-dashboard.json"
METRIC = re.compile(r"\b(fairlane_[a-z0-9_]+)\b")
SUFFIXES = ("_bucket", "_count", "_sum", "_total")
FUNCTIONS = {
    "sum",
    "min",
    "max",
    "rate",
    "increase",
    "histogram_quantile",
    "by",
    "without",
    "offset",
    "and",
    "or",
    "unless",
}


def rules() -> list[dict]:
    return [
        rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]
    ]


def dashboard_targets() -> list[dict]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [t for p in panels for t in p.get("targets", [])]


def expressions() -> list[str]:
    return [r["expr"] for r in rules()] + [t["expr"] for t in dashboard_targets()]


def test_the_rules_and_the_dashboard_are_well_formed():
    names = [r["alert"] for r in rules()]
    assert len(names) == len(set(names)) >= 10
    for rule in rules():
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule["alert"]
        assert rule["labels"]["severity"] in {"info", "warning", "critical"}
        assert rule["annotations"]["summary"]
        assert re.fullmatch(r"\d+[smh]", rule.get("for", "0s")), rule["alert"]
    board = json.loads(DASHBOARD.read_text())
    assert board["uid"] and board["title"] == "Fairlane" and board["schemaVersion"] >= 36
    assert [v["type"] for v in board["templating"]["list"]] == ["datasource"]
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for target in dashboard_targets():
        assert target["datasource"]["uid"] == "${datasource}"
    for expr in expressions():
        assert expr.count("(") == expr.count(")") and expr.count("{") == expr.count("}"), expr
        words = set(re.findall(r"\b([a-z_]+)\s*\(", expr))
        assert words <= FUNCTIONS, (expr, words - FUNCTIONS)
        for rng in re.findall(r"\[([^\]]+)\]", expr):
            assert re.fullmatch(r"\d+[smhd]", rng), expr


def scrape(client) -> dict[str, set[str]]:
    """Sample name (and family name) -> the label names it carries."""
    response = client.get("/metrics")
    assert response.status_code == 200
    labels: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(response.content.decode()):
        labels.setdefault(family.name, set())
        for sample in family.samples:
            labels.setdefault(sample.name, set()).update(sample.labels)
            labels[family.name].update(sample.labels)
    return labels


@pytest.fixture
def activity(
    tenant,
    agent,
    tiny,
    settings,
    django_capture_on_commit_callbacks,
    namespace,
    embedded,
    distributed_runtime,
):
    """What a working deployment has done by the time Prometheus scrapes it."""
    rules_cache_clear()
    embedded.engine_host.load(model_get(name="tiny"))
    budget_create(tenant=tenant, agent=agent, limit_microcents=1_000)
    alert_destination_add(tenant=tenant, kind="email", target="ops@acme.example")
    with django_capture_on_commit_callbacks(execute=True):
        request_id = uuid.uuid4().hex
        budget_reserve(tenant=tenant, agent=agent, amount_microcents=900, request_id=request_id)
        budget_settle(
            tenant=tenant,
            request_id=request_id,
            cost_microcents=900,
            usage=Usage(backend="local", model="tiny"),
        )
    # The embedded runtime's sender may take either delivery first: send what it left, and
    # wait until both are delivered.
    alert_deliveries_send_due()
    wait_for(
        lambda: AlertDelivery.objects.filter(status=AlertDelivery.Status.DELIVERED).count() == 2,
        what="both deliveries",
    )
    Backend.objects.create(
        name="remote-a", kind="openai_compatible", base_url="http://127.0.0.1:9", health="live"
    )
    assert breakers.begin("remote-a")
    breakers.success("remote-a", 12.0)
    breakers.end("remote-a")
    ROUTE_ATTEMPTS.labels("remote-a", "ok").inc()
    ROUTE_TTFT.labels("remote-a").observe(0.012)
    timer = TokenTimer(model="tiny", backend="local")
    for _ in range(3):
        timer.see(Tokens(choice=0, text="a", token_ids=(1,)))
    timer.done()
    embedded.pool.verify_failure_count(model="tiny", reason="unsigned")
    request_times_observe(
        {"queued": 1.0, "lane": "standard", "taken": 1.2, "first_token": 1.25, "last_token": 1.45},
        model="tiny",
        output_tokens=5,
    )
    # The fair queue in Redis, two thirds full: a bulk request is shed (brownout).
    settings.FAIRLANE_MAX_QUEUE_PER_LANE = 3
    queue = queue_for(distributed_runtime.redis, "tiny")
    for i in range(2):
        queue.enqueue(
            id=f"q{i}", tenant=str(tenant.pk), lane="standard", weight=1, cost=4, payload={}
        )
    with pytest.raises(Overloaded):
        load_admit(
            pool=distributed_runtime.pool,
            info=model_get(name="tiny"),
            lane="bulk",
            tenant=str(tenant.pk),
            max_tokens=16,
        )
    yield
    queue.clear()


def test_every_metric_the_rules_and_dashboard_query_is_exported_with_its_labels(
    client, activity, distributed_runtime
):
    from routing.runtimes import runtime_using

    assert client.get("/v1/models").status_code == 401  # a /v1 request, counted
    exported = scrape(client)
    with runtime_using(distributed_runtime):  # the fair queue's figures come from Redis
        distributed = scrape(client)
    for name, labels in distributed.items():
        exported.setdefault(name, set()).update(labels)
    for expr in expressions():
        used = set(METRIC.findall(expr))
        assert used, expr
        carried: set[str] = {"le"}
        for name in used:
            assert name in exported, f"{name} (in {expr!r}) is not in /metrics"
            base = next((name.removesuffix(s) for s in SUFFIXES if name.endswith(s)), name)
            carried |= exported[name] | exported.get(base, set())
        selected = {
            m
            for block in re.findall(r"\{([^}]*)\}", expr)
            for m in re.findall(r"([a-z_]+)\s*=~?", block)
        }
        grouped = {
            label.strip()
            for group in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr)
            for label in group.split(",")
            if label.strip()
        }
        assert selected | grouped <= carried, (expr, (selected | grouped) - carried)
