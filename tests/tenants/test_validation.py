"""A write that passed validation but still broke a constraint is answered for what happened:
a concurrent duplicate reads "already exists" and a deletion that won the race "was just
removed", both 409 conflicts, never read as each other."""

import pytest
from django.db.models.signals import pre_save

from tenants.models import Agent, Tenant
from tenants.services.tenancy import agent_create
from tenants.services.validation import Conflict

pytestmark = pytest.mark.django_db(transaction=True)


def racing(action):
    """Run `action(agent)` just before an Agent row is written (another request's commit)."""

    def receiver(sender, instance, **kwargs):
        pre_save.disconnect(receiver, sender=Agent)
        action(instance)

    pre_save.connect(receiver, sender=Agent, weak=False)


def test_a_concurrent_duplicate_reads_as_taken_in_words(tenant):
    racing(lambda agent: Agent.objects.create(tenant=tenant, name=agent.name))
    with pytest.raises(Conflict) as exc_info:
        agent_create(tenant=tenant, name="writer")
    assert exc_info.value.status == 409
    assert exc_info.value.message == "name: Another agent already has this name."
    assert exc_info.value.param == "name"


def test_a_duplicate_name_reads_in_words_not_djangos_column_names(tenant):
    # Issue 28: the portal showed "Agent with this Tenant and Name already exists."
    agent_create(tenant=tenant, name="writer")
    with pytest.raises(Conflict) as exc_info:
        agent_create(tenant=tenant, name="writer")
    assert exc_info.value.message == "name: Another agent already has this name."


def test_a_deletion_that_won_the_race_is_a_conflict_not_a_duplicate(tenant, client_for, owner):
    racing(lambda agent: Tenant.objects.filter(pk=agent.tenant_id).delete())
    response = client_for(owner).post(
        f"/api/tenants/{tenant.slug}/agents/", {"name": "writer"}, format="json"
    )
    assert response.status_code == 409, response.content
    error = response.json()["error"]
    assert error["code"] == "conflict" and "already has" not in error["message"]
    assert not Agent.objects.filter(name="writer").exists()
