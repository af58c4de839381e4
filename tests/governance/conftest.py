"""Fixtures for the audit log, SCIM and single sign-on tests."""

import pytest
from django.test import Client

from tenants.models import AuditRecord, Role


@pytest.fixture
def portal_as(member_of, tenant):
    """portal_as(role) -> a Django test client signed in as a person with that role in Acme."""

    def make(role: str = Role.ADMIN, username: str | None = None):
        user = (
            tenant.memberships.get(role=Role.OWNER).user
            if role == Role.OWNER
            else member_of(tenant, role, username)
        )
        client = Client()
        client.force_login(user)
        return client, user

    return make


def last_record(**filters) -> AuditRecord:
    record = AuditRecord.objects.filter(**filters).order_by("-id").first()
    assert record is not None, f"no audit record with {filters}"
    return record
