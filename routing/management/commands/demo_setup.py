"""Create, where missing, what a new user needs to try Fairlane: an admin user, a demo tenant,
an agent with a daily budget, an API key, and the `tiny` model (a seeded preset). Secrets are
printed once, when created."""

import secrets
from collections.abc import Callable
from typing import TypeVar

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction
from django.utils import timezone

from tenants.errors import ApplicationError
from tenants.models import MICROCENTS_PER_USD, Agent, ApiKey, Budget, Role, Scope, Tenant
from tenants.services.budgets import budget_create
from tenants.services.keys import api_key_create
from tenants.services.tenancy import agent_create, member_add, tenant_create
from workers.artifacts.keys import key_id
from workers.artifacts.trust import dev_key_ensure, dev_key_path
from workers.models import ServedModel
from workers.serving.registration import model_register

DEMO_KEY_NAME = "demo (make run)"
DEMO_USER = "demo"
T = TypeVar("T")
# The demo model's prices: $0.10 / $0.40 / $0.05 per million input / output / cached tokens.
DEMO_PRICES = {
    "price_input_per_mtok": 10_000_000,
    "price_output_per_mtok": 40_000_000,
    "price_cached_per_mtok": 5_000_000,
}


class Command(BaseCommand):
    help = "Create the admin user, demo tenant, agent, budgets and API key if missing."

    def add_arguments(self, parser):
        parser.add_argument("--base-url", default="http://127.0.0.1:8000")
        parser.add_argument(
            "--new-key", action="store_true", help="Issue a new demo key even if one exists."
        )

    def handle(self, *args, base_url: str, new_key: bool, **options):
        """Each step on its own: one that cannot be done (say, the demo agent was deactivated
        in the portal) is reported, and the rest still run, so `make run` always serves."""
        lines: list[str] = []

        def step(what: str, action: Callable[[], T]) -> T | None:
            try:
                with transaction.atomic():
                    return action()
            except ApplicationError as exc:
                lines.append(f"  Skipped:     {what}: {exc.message}")
                return None

        admin = self._admin(lines)
        tenant = step(
            "the demo tenant",
            lambda: (
                Tenant.objects.filter(slug="demo").first()
                or tenant_create(name="Demo", slug="demo", owner=admin)
            ),
        )
        if tenant is not None:
            step("the demo portal user", lambda: lines.append(self._portal_user(tenant)))
        agent = step("the demo agent", lambda: self._agent(tenant)) if tenant else None
        # The local development key signs the presets (and trained models) as they are made.
        dev_key = dev_key_ensure()
        if dev_key is not None:
            lines.append(
                f"  Signing key: {dev_key_path()} (development key "
                f"{key_id(dev_key.public_key())[:19]}...: signs the presets)"
            )
        if not ServedModel.objects.filter(name="tiny").exists():
            step(
                "the tiny model",
                lambda: model_register(
                    name="tiny",
                    source="preset:tiny",
                    description="Seeded random weights: fast, and gibberish.",
                    price_input_per_mtok=DEMO_PRICES["price_input_per_mtok"],
                    price_output_per_mtok=DEMO_PRICES["price_output_per_mtok"],
                    price_cached_per_mtok=DEMO_PRICES["price_cached_per_mtok"],
                ),
            )
        shown = "$FAIRLANE_KEY"
        if agent is not None and not agent.is_active:
            lines.append(
                "  Skipped:     the demo key: demo-agent is deactivated; reactivate "
                "it in the portal (Agents), then `make demo-key`"
            )
        elif agent is not None and tenant is not None:
            demo_tenant, demo_agent = tenant, agent
            shown = (
                step(
                    "the demo key",
                    lambda: self._key(demo_tenant, demo_agent, admin, new_key, lines),
                )
                or shown
            )
        lines += [
            "  Tenant:      demo, agent demo-agent (daily budget $5, tenant $50)",
            "  Model:       tiny (preset; docs/models.md: loading your own checkpoint)",
            f"  Portal:      {base_url}/portal/  (sign in as the demo user)",
            f"  Admin:       {base_url}/admin/",
            f"  API docs:    {base_url}/api/docs/",
            f"  Health:      {base_url}/healthz  {base_url}/readyz",
            f'  Try:         curl -H "Authorization: Bearer {shown}" {base_url}/v1/models',
            f'               curl -N {base_url}/v1/chat/completions -H "Authorization: Bearer '
            f'{shown}" -H "Content-Type: application/json" -d \'{{"model": "tiny", "messages": '
            '[{"role": "user", "content": "Hello"}], "max_tokens": 32, "stream": true}\'',
        ]
        self.stdout.write("Fairlane is ready.\n" + "\n".join(lines))

    def _admin(self, lines: list[str]):
        User = get_user_model()
        admin = User.objects.filter(is_superuser=True).order_by("pk").first()
        if admin is None:
            password = secrets.token_urlsafe(12)
            admin = User.objects.create_superuser("admin", "admin@localhost", password)
            lines.append(f"  Admin user:  admin / {password}   (shown once)")
        else:
            lines.append(
                f"  Admin user:  {admin.get_username()} (exists; reset with "
                f"`make manage ARGS='changepassword {admin.get_username()}'`)"
            )
        return admin

    def _agent(self, tenant: Tenant) -> Agent:
        agent = Agent.objects.filter(tenant=tenant, name="demo-agent").first() or agent_create(
            tenant=tenant, name="demo-agent", description="Created by make run"
        )
        if not Budget.objects.filter(tenant=tenant, owner_key="tenant").exists():
            budget_create(tenant=tenant, agent=None, limit_microcents=50 * MICROCENTS_PER_USD)
        if not Budget.objects.filter(tenant=tenant, owner_key=f"agent:{agent.pk}").exists():
            budget_create(tenant=tenant, agent=agent, limit_microcents=5 * MICROCENTS_PER_USD)
        return agent

    def _key(self, tenant: Tenant, agent: Agent, admin, new_key: bool, lines: list[str]):
        """The demo key: shown when it is made (returned), else named by its prefix."""
        usable = [
            k
            for k in ApiKey.objects.filter(agent=agent, name=DEMO_KEY_NAME)
            if k.is_usable_at(timezone.now())
        ]
        if usable and not new_key:
            lines.append(
                f"  API key:     {usable[0].prefix}... (exists; keys are shown only "
                f"when created; `make demo-key` issues a new one)"
            )
            return None
        _, plain = api_key_create(
            tenant=tenant,
            agent=agent,
            name=DEMO_KEY_NAME,
            scopes=list(Scope.values),
            created_by=admin,
        )
        lines.append(f"  API key:     {plain}   (shown once)")
        return plain

    def _portal_user(self, tenant: Tenant) -> str:
        """The demo tenant's portal user (an admin of it, not an operator)."""
        User = get_user_model()
        user = User.objects.filter(username=DEMO_USER).first()
        if user is not None:
            return (
                f"  Portal user: {DEMO_USER} (exists; reset with "
                f"`make manage ARGS='changepassword {DEMO_USER}'`)"
            )
        password = secrets.token_urlsafe(12)
        user = User.objects.create_user(DEMO_USER, f"{DEMO_USER}@localhost", password)
        member_add(tenant=tenant, user=user, role=Role.ADMIN, actor_role=Role.OWNER)
        return f"  Portal user: {DEMO_USER} / {password}   (shown once)"
