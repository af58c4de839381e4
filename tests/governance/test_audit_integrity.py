"""The audit log holds against tampering: audit_verify names the first bad record of an
edited, deleted, inserted or reordered chain, and a chain rewritten whole no longer matches its
signed checkpoint; PostgreSQL refuses UPDATE and DELETE to the application's role; only the
retention role deletes, and the chain still verifies after; two writers never fork a chain;
no secret ever reaches a record; one tenant never sees another's records."""

import json
import threading
from datetime import timedelta
from io import StringIO
from zoneinfo import ZoneInfo

import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connection, connections, transaction
from django.utils import timezone

from tenants.models import AuditCheckpoint, AuditRecord, Role, chain_name
from tenants.services.alerts import alert_destination_add
from tenants.services.audit import audit_record, audit_verify, record_hash
from tenants.services.audit.record import HASHED
from tenants.services.keys import api_key_create
from tenants.services.scim_tokens import scim_token_create
from workers.artifacts.audit_signing import audit_checkpoint_sign, audit_checkpoint_valid

pytestmark = pytest.mark.django_db


@pytest.fixture
def chain(tenant):
    """Five records in Acme's chain (besides its creation's), oldest first."""
    for n in range(5):
        audit_record(
            action="test.step", object_type="thing", object_id=n, tenant=tenant, after={"n": n}
        )
    return list(AuditRecord.objects.filter(chain=chain_name(tenant.pk)).order_by("seq"))


def tamper(sql: str, params=()) -> None:
    """Direct SQL as a database owner who turned the table's trigger off for the session."""
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL session_replication_role = replica")
        cursor.execute(sql, params)
        cursor.execute("SET LOCAL session_replication_role = origin")


def consume(response) -> str:
    """An async streamed export, read from this sync test (as tests/portal/test_reports.py)."""
    with pytest.warns(Warning, match="consume asynchronous iterators"):
        return b"".join(response).decode()


def verify_fails() -> str:
    err = StringIO()
    with pytest.raises(CommandError):
        call_command("audit_verify", stderr=err, stdout=StringIO())
    return err.getvalue()


def test_an_intact_log_verifies(chain):
    out = StringIO()
    call_command("audit_verify", stdout=out)
    assert "audit log intact" in out.getvalue()


def test_an_edited_record_is_named(chain):
    victim = chain[3]
    tamper(
        "UPDATE tenants_auditrecord SET after = %s WHERE id = %s",
        [json.dumps({"n": 99}), victim.id],
    )
    report = verify_fails()
    assert f"edited: record id {victim.id} (seq {victim.seq})" in report


def test_a_deleted_record_is_named_by_the_gap_it_leaves(chain):
    tamper("DELETE FROM tenants_auditrecord WHERE id = %s", [chain[2].id])
    report = verify_fails()
    assert f"deleted: record id {chain[3].id} (seq {chain[3].seq})" in report
    assert f"seq {chain[2].seq} missing" in report


def test_a_deleted_last_record_is_found_by_the_head(chain):
    tamper("DELETE FROM tenants_auditrecord WHERE id = %s", [chain[-1].id])
    report = verify_fails()
    assert f"deleted: record id {chain[-2].id}" in report and "missing" in report


def test_an_inserted_record_is_named(chain, tenant):
    # A forged record slipped in after the second one, with a correct hash and link, the
    # records after it renumbered: written after those it precedes.
    at = chain[1].seq + 1
    tamper(
        "UPDATE tenants_auditrecord SET seq = seq + 1000 WHERE chain = %s AND seq >= %s",
        [chain[1].chain, at],
    )
    tamper(
        "UPDATE tenants_auditrecord SET seq = seq - 999 WHERE chain = %s AND seq >= %s",
        [chain[1].chain, at + 1000],
    )
    forged = {name: getattr(chain[1], name) for name in HASHED}
    forged.update(
        seq=at,
        prev_hash=chain[1].hash,
        action="api_key.revoke",
        after={"x": 1},
        created_at=chain[1].created_at + timedelta(microseconds=1),
    )
    forged["hash"] = record_hash(forged)
    inserted = AuditRecord.objects.create(**forged)
    report = verify_fails()
    assert f"inserted: record id {inserted.id} (seq {at})" in report


def test_reordered_records_are_named(chain):
    a, b = chain[1], chain[2]
    tamper("UPDATE tenants_auditrecord SET seq = -1 WHERE id = %s", [a.id])
    tamper("UPDATE tenants_auditrecord SET seq = %s WHERE id = %s", [a.seq, b.id])
    tamper("UPDATE tenants_auditrecord SET seq = %s WHERE id = %s", [b.seq, a.id])
    report = verify_fails()
    assert f"reordered: record id {b.id} (seq {a.seq})" in report


def test_a_chain_rewritten_whole_differs_from_its_signed_checkpoint(chain, tenant):
    checkpoint = audit_checkpoint_sign()
    assert checkpoint is not None and audit_checkpoint_valid(checkpoint)
    # Rewrite the third record and re-hash everything after it, head included: the chain
    # alone verifies again, the signed checkpoint does not.
    victim = AuditRecord.objects.get(id=chain[2].id)
    tamper(
        "UPDATE tenants_auditrecord SET after = %s WHERE id = %s",
        [json.dumps({"n": -1}), victim.id],
    )
    previous = chain[1].hash
    for record in AuditRecord.objects.filter(chain=victim.chain, seq__gte=victim.seq).order_by(
        "seq"
    ):
        fields = {name: getattr(record, name) for name in HASHED}
        fields["prev_hash"] = previous
        previous = record_hash(fields)
        tamper(
            "UPDATE tenants_auditrecord SET prev_hash = %s, hash = %s WHERE id = %s",
            [fields["prev_hash"], previous, record.id],
        )
    tamper("UPDATE tenants_auditchainhead SET hash = %s WHERE chain = %s", [previous, victim.chain])
    assert not audit_verify(chains=[victim.chain])  # the chain alone no longer tells
    report = verify_fails()
    assert f"rewritten: record id {chain[-1].id}" in report
    assert f"checkpoint {checkpoint.pk}" in report


def test_a_forged_checkpoint_is_refused(chain):
    checkpoint = audit_checkpoint_sign()
    payload = json.loads(checkpoint.payload)
    payload["heads"][chain[0].chain][0] += 1
    AuditCheckpoint.objects.filter(pk=checkpoint.pk).update(
        payload=json.dumps(payload, sort_keys=True, separators=(",", ":"))
    )
    assert "has no valid signature" in verify_fails()


def test_the_trigger_refuses_update_and_delete_to_the_applications_role(chain):
    for sql in (
        "UPDATE tenants_auditrecord SET action = 'x' WHERE id = %s",
        "DELETE FROM tenants_auditrecord WHERE id = %s",
    ):
        with pytest.raises(DatabaseError, match="append-only: (UPDATE|DELETE) refused"):
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(sql, [chain[0].id])
    assert AuditRecord.objects.get(id=chain[0].id).action == chain[0].action


@pytest.fixture
def retention_login(transactional_db):
    """A login role granted the retention role (how production runs retention)."""
    db = connection.settings_dict
    role = f"{db['NAME']}_pruner"[:60]
    with connection.cursor() as cursor:
        cursor.execute(f'DROP ROLE IF EXISTS "{role}"')
        cursor.execute(f'CREATE ROLE "{role}" LOGIN IN ROLE fairlane_audit_retention')
    yield f"postgres://{role}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
    for alias in connections:
        connections[alias].close()
    with connection.cursor() as cursor:
        cursor.execute(f'DROP ROLE IF EXISTS "{role}"')


def test_retention_deletes_as_its_own_role_and_the_chain_still_verifies(
    retention_login, tenant, settings
):
    for n in range(4):
        audit_record(action="test.step", object_type="thing", object_id=n, tenant=tenant)
    old = list(AuditRecord.objects.filter(chain=chain_name(tenant.pk)).order_by("seq"))[:3]
    with connection.cursor() as cursor:  # backdating is itself tampering: done as the owner
        cursor.execute("SET session_replication_role = replica")
        cursor.execute(
            "UPDATE tenants_auditrecord SET created_at = created_at - interval "
            "'40 days' WHERE id = ANY(%s)",
            [[r.id for r in old]],
        )
        cursor.execute("SET session_replication_role = origin")
    # (their hashes no longer match their backdated time: give them matching ones)
    previous = "0" * 64
    for record in AuditRecord.objects.filter(chain=chain_name(tenant.pk)).order_by("seq"):
        fields = {name: getattr(record, name) for name in HASHED}
        fields["prev_hash"] = previous
        previous = record_hash(fields)
        with connection.cursor() as cursor:
            cursor.execute("SET session_replication_role = replica")
            cursor.execute(
                "UPDATE tenants_auditrecord SET prev_hash = %s, hash = %s WHERE id = %s",
                [fields["prev_hash"], previous, record.id],
            )
            cursor.execute(
                "UPDATE tenants_auditchainhead SET hash = %s WHERE chain = %s",
                [previous, record.chain],
            )
            cursor.execute("SET session_replication_role = origin")
    assert not audit_verify()
    settings.FAIRLANE_AUDIT_RETENTION_DATABASE_URL = retention_login
    out = StringIO()
    call_command("audit_retention", "--days", "30", stdout=out)
    assert "deleted 3 audit records" in out.getvalue()
    remaining = AuditRecord.objects.filter(chain=chain_name(tenant.pk)).order_by("seq")
    assert [r.seq for r in remaining] == [4, 5, 6]  # tenant.create and member.add first
    assert not audit_verify()  # verifies from its first remaining record


def test_two_writers_never_fork_a_chain(transactional_db, tenant):
    errors = []

    def write(n: int) -> None:
        try:
            for i in range(10):
                audit_record(
                    action="test.race", object_type="thing", object_id=f"{n}-{i}", tenant=tenant
                )
        except Exception as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=write, args=(n,)) for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    seqs = list(
        AuditRecord.objects.filter(chain=chain_name(tenant.pk))
        .order_by("seq")
        .values_list("seq", flat=True)
    )
    assert seqs == list(range(1, len(seqs) + 1)) and len(seqs) >= 20
    assert not audit_verify(chains=[chain_name(tenant.pk)])


def test_no_secret_ever_reaches_a_record(tenant, agent, admin_client, settings):
    settings.FAIRLANE_ALERT_WEBHOOK_ALLOW_PRIVATE = True
    key, plain = api_key_create(tenant=tenant, agent=agent, name="k")
    destination, webhook_secret = alert_destination_add(
        tenant=tenant, kind="webhook", target="https://127.0.0.1:9/fairlane"
    )
    token, scim_plain = scim_token_create(tenant=tenant)
    from routing.backend_store import backend_register

    backend = backend_register(
        name="oai",
        kind="openai",
        base_url="https://api.openai.com",
        credential="sk-very-secret-credential",
    )
    user = tenant.memberships.get().user
    admin_client.post(
        f"/admin/auth/user/{user.pk}/password/",
        {"password1": "Zq-new-Passw0rd!", "password2": "Zq-new-Passw0rd!"},
    )
    user.refresh_from_db()
    everything = json.dumps(
        [[r.before, r.after, r.object_repr, r.actor] for r in AuditRecord.objects.all()]
    )
    for secret in (
        plain,
        key.secret_hash,
        webhook_secret,
        destination.secret_encrypted,
        scim_plain,
        token.secret_hash,
        "sk-very-secret-credential",
        backend.credential_encrypted,
        "Zq-new-Passw0rd!",
        user.password,
    ):
        assert secret and secret not in everything


def test_another_tenants_records_do_not_exist_for_you(
    tenant, other_tenant, agent, portal_as, member_of
):
    api_key_create(tenant=tenant, agent=agent, name="acme-only")
    client, _ = portal_as(Role.ADMIN)
    page = client.get(f"/portal/t/{tenant.slug}/audit/").content.decode()
    assert "api_key.create" in page
    from django.test import Client

    outsider = Client()
    outsider.force_login(member_of(other_tenant, Role.ADMIN, "globex-admin"))
    assert outsider.get(f"/portal/t/{tenant.slug}/audit/").status_code == 404
    assert outsider.get(f"/portal/t/{tenant.slug}/audit.jsonl").status_code == 404
    own = outsider.get(f"/portal/t/{other_tenant.slug}/audit.jsonl")
    lines = [json.loads(line) for line in consume(own).splitlines()]
    assert lines and all(line["tenant"] == other_tenant.slug for line in lines)
    viewer, _ = portal_as(Role.VIEWER)
    assert viewer.get(f"/portal/t/{tenant.slug}/audit/").status_code == 403


def test_exports_and_filters(tenant, agent, portal_as):
    api_key_create(tenant=tenant, agent=agent, name="filtered")
    client, _ = portal_as(Role.ADMIN)
    response = client.get(f"/portal/t/{tenant.slug}/audit.csv?action=api_key.")
    rows = consume(response).splitlines()
    assert rows[0].startswith("id,created_at,tenant") and len(rows) == 2
    assert ",api_key.create," in rows[1]
    assert client.get(f"/portal/t/{tenant.slug}/audit.xml").status_code == 404
    # The portal reads dates in the tenant's own zone (Berlin here), so "tomorrow" is its tomorrow.
    since = (timezone.localdate(timezone=ZoneInfo(tenant.timezone)) + timedelta(days=1)).isoformat()
    assert (
        "No records match"
        in client.get(f"/portal/t/{tenant.slug}/audit/?since={since}").content.decode()
    )


def test_operators_see_every_tenants_and_the_platforms_records(
    tenant, other_tenant, admin_client, client, owner
):
    page = admin_client.get("/ops/audit/?tenant=globex").content.decode()
    assert "globex" in page and "acme" not in page.split("<table")[1]
    client.force_login(owner)
    assert client.get("/ops/audit/").status_code == 403
