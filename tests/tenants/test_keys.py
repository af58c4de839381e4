"""API keys: hashed at rest, shown once, refused at once when revoked or expired, rotated with
a grace period, never more powerful than whoever made them."""

from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.core import serializers as django_serializers
from django.db import connection
from django.test.utils import CaptureQueriesContext

from tenants.errors import AuthenticationFailed, InvalidRequest, PermissionDenied
from tenants.models import ApiKey, Role, Scope, Tenant
from tenants.services.keys import (
    api_key_authenticate,
    api_key_create,
    api_key_revoke,
    api_key_rotate,
)
from tenants.services.tenancy import agent_deactivate


def test_key_is_returned_once_and_only_a_keyed_hash_is_stored(tenant, agent):
    key, plain = api_key_create(tenant=tenant, agent=agent, name="ci")
    assert plain.startswith(key.prefix + "-") and len(plain) == len("fl-") + 12 + 1 + 43
    stored = django_serializers.serialize("json", ApiKey.objects.all())
    secret = plain.rsplit("-", 1)[1]
    assert secret not in stored and plain not in stored
    assert len(key.secret_hash) == 64 and key.secret_hash not in plain


def test_keys_are_random(tenant, agent):
    plains = {api_key_create(tenant=tenant, agent=agent)[1] for _ in range(20)}
    assert len(plains) == 20


def test_authenticate_accepts_the_key_and_refuses_any_other(tenant, agent, api_key):
    key, plain = api_key
    assert api_key_authenticate(plain=plain).pk == key.pk
    wrong_secret = plain[:-1] + ("a" if plain[-1] != "a" else "b")
    for bad in [
        wrong_secret,
        plain + "x",
        "fl-" + "0" * 12 + "-" + "A" * 43,
        "",
        "Bearer",
        plain.upper(),
        key.prefix,
    ]:
        with pytest.raises(AuthenticationFailed):
            api_key_authenticate(plain=bad)


def test_revoked_key_is_refused_at_once(api_key):
    key, plain = api_key
    api_key_authenticate(plain=plain)
    api_key_revoke(key=key)
    with pytest.raises(AuthenticationFailed, match="revoked or expired"):
        api_key_authenticate(plain=plain)


def test_expired_key_is_refused(tenant, agent):
    expires = datetime.now(UTC) + timedelta(hours=1)
    _, plain = api_key_create(tenant=tenant, agent=agent, expires_at=expires)
    api_key_authenticate(plain=plain, now=expires - timedelta(seconds=1))
    with pytest.raises(AuthenticationFailed):
        api_key_authenticate(plain=plain, now=expires)


def test_rotation_keeps_the_old_key_for_the_grace_period_only(api_key):
    old, old_plain = api_key
    new, new_plain = api_key_rotate(key=old, grace_seconds=600)
    assert (
        new.rotated_from_id == old.pk and new.scopes == old.scopes and new.agent_id == old.agent_id
    )
    now = datetime.now(UTC)
    assert api_key_authenticate(plain=old_plain, now=now + timedelta(seconds=590)).pk == old.pk
    with pytest.raises(AuthenticationFailed):
        api_key_authenticate(plain=old_plain, now=now + timedelta(seconds=601))
    assert api_key_authenticate(plain=new_plain, now=now + timedelta(days=3)).pk == new.pk


def test_rotation_without_grace_stops_the_old_key_now(api_key):
    old, old_plain = api_key
    _, new_plain = api_key_rotate(key=old, grace_seconds=0)
    with pytest.raises(AuthenticationFailed):
        api_key_authenticate(plain=old_plain)
    api_key_authenticate(plain=new_plain)


@pytest.mark.parametrize("grace", [-1, 10**9, "60", 1.5, True])
def test_rotation_rejects_bad_grace(api_key, grace):
    with pytest.raises(InvalidRequest):
        api_key_rotate(key=api_key[0], grace_seconds=grace)
    assert ApiKey.objects.count() == 1


def test_suspended_tenant_and_deactivated_agent_lock_their_keys_out(tenant, agent, api_key):
    _, plain = api_key
    Tenant.objects.filter(pk=tenant.pk).update(status=Tenant.Status.SUSPENDED)
    with pytest.raises(PermissionDenied, match="suspended"):
        api_key_authenticate(plain=plain)
    Tenant.objects.filter(pk=tenant.pk).update(status=Tenant.Status.ACTIVE)
    agent_deactivate(agent=agent)
    with pytest.raises(AuthenticationFailed):
        api_key_authenticate(plain=plain)  # deactivation revoked it


def test_last_used_is_written_once_per_interval_not_per_request(api_key, settings):
    settings.FAIRLANE_KEY_LAST_USED_RESOLUTION_SECONDS = 60
    key, plain = api_key
    start = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    with time_machine.travel(start, tick=False):
        api_key_authenticate(plain=plain)
        with CaptureQueriesContext(connection) as queries:
            api_key_authenticate(plain=plain)
        assert not [q for q in queries if q["sql"].startswith("UPDATE")]
    with time_machine.travel(start + timedelta(seconds=61), tick=False):
        api_key_authenticate(plain=plain)
    key.refresh_from_db()
    assert key.last_used_at == start + timedelta(seconds=61)


def test_a_member_cannot_mint_a_key_more_powerful_than_themselves(tenant, agent):
    with pytest.raises(PermissionDenied):
        api_key_create(
            tenant=tenant, agent=agent, scopes=[Scope.MANAGEMENT_WRITE], actor_role=Role.MEMBER
        )
    key, _ = api_key_create(
        tenant=tenant, agent=agent, scopes=[Scope.MANAGEMENT_WRITE], actor_role=Role.ADMIN
    )
    assert key.scopes == [Scope.MANAGEMENT_WRITE]


def test_a_key_cannot_be_made_for_another_tenants_agent(tenant, other_agent):
    with pytest.raises(InvalidRequest):
        api_key_create(tenant=tenant, agent=other_agent)
    assert not ApiKey.objects.exists()
