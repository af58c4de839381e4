"""API keys: creation (the plain key is returned once), authentication, revocation, rotation.

A key reads `fl-<key_id>-<secret>`: key_id (12 lowercase letters and digits) finds the row and
is safe to show and log; the secret (43 letters and digits, ~256 bits) is never stored. The row
keeps HMAC-SHA256(pepper, key): a keyed hash suits high-entropy tokens (no slow KDF needed, and
a database dump alone cannot test guesses), compared in constant time.
"""

import hashlib
import hmac
import logging
import re
import secrets
import string
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from tenants.errors import AuthenticationFailed, InvalidRequest, PermissionDenied
from tenants.models import ROLE_RANK, Agent, ApiKey, Role, Scope, Tenant
from tenants.services.audit import audit_change, snapshot
from tenants.services.validation import Conflict

logger = logging.getLogger(__name__)

KEY_PATTERN = re.compile(r"^fl-([a-z0-9]{12})-([A-Za-z0-9]{43})$")
_KEY_ID_ALPHABET = string.ascii_lowercase + string.digits
_SECRET_ALPHABET = string.ascii_letters + string.digits
DEFAULT_SCOPES = [str(Scope.INFERENCE)]
# The least role a person needs to mint a key carrying each scope: a key must never carry
# more power than the member who made it.
SCOPE_MIN_ROLE = {
    Scope.INFERENCE: Role.MEMBER,
    Scope.MANAGEMENT_READ: Role.MEMBER,
    Scope.MANAGEMENT_WRITE: Role.ADMIN,
}
MAX_GRACE_SECONDS = 30 * 24 * 3600


def _key_hash(plain: str) -> str:
    return hmac.new(
        settings.FAIRLANE_API_KEY_PEPPER.encode(), plain.encode(), hashlib.sha256
    ).hexdigest()


def api_key_fingerprint(plain: str) -> str:
    """What the row stores for a key (its keyed hash): safe to keep in memory and in logs."""
    return _key_hash(plain)


def _random(alphabet: str, length: int) -> str:
    return "".join(secrets.choice(alphabet) for _ in range(length))


def api_key_scopes_clean(*, scopes, actor_role: str) -> list[str]:
    if not isinstance(scopes, list) or not scopes or not all(isinstance(s, str) for s in scopes):
        raise InvalidRequest("scopes must be a non-empty list.", param="scopes")
    unknown = sorted(set(scopes) - set(Scope.values))
    if unknown:
        raise InvalidRequest(
            f"Unknown scopes: {', '.join(unknown)}. Known: {', '.join(Scope.values)}.",
            param="scopes",
        )
    for scope in scopes:
        if ROLE_RANK[actor_role] < ROLE_RANK[SCOPE_MIN_ROLE[scope]]:
            raise PermissionDenied(f"Your role cannot grant the {scope} scope.")
    return sorted(set(scopes))


def api_key_create(
    *,
    tenant: Tenant,
    agent: Agent,
    name: str = "",
    scopes: list[str] | None = None,
    expires_at: datetime | None = None,
    created_by: User | None = None,
    actor_role: str = Role.OWNER,
    rpm_limit: int | None = None,
    tpm_limit: int | None = None,
    concurrency_limit: int | None = None,
) -> tuple[ApiKey, str]:
    """Create a key for an agent; the plain key is returned once and never stored."""
    if agent.tenant_id != tenant.id:
        raise InvalidRequest("agent does not belong to this tenant.", param="agent")
    if not agent.is_active:
        raise InvalidRequest("agent is deactivated.", param="agent")
    if expires_at is not None and expires_at <= timezone.now():
        raise InvalidRequest("expires_at must be in the future.", param="expires_at")
    if len(name) > 100:
        raise InvalidRequest("name is longer than 100 characters.", param="name")
    scopes = api_key_scopes_clean(scopes=scopes or DEFAULT_SCOPES, actor_role=actor_role)
    key_id = _random(_KEY_ID_ALPHABET, 12)
    plain = f"fl-{key_id}-{_random(_SECRET_ALPHABET, 43)}"
    with transaction.atomic():
        key = ApiKey.objects.create(
            tenant=tenant,
            agent=agent,
            name=name,
            key_id=key_id,
            secret_hash=_key_hash(plain),
            scopes=scopes,
            expires_at=expires_at,
            created_by=created_by,
            rpm_limit=rpm_limit,
            tpm_limit=tpm_limit,
            concurrency_limit=concurrency_limit,
        )
        audit_change("api_key.create", key)
    logger.info("api key created: %s tenant=%s agent=%s", key.prefix, tenant.slug, agent.name)
    return key, plain


def api_key_authenticate(*, plain: str, now: datetime | None = None) -> ApiKey:
    """The key a request presents, if it is well-formed, known, unexpired and unrevoked, and its
    tenant and agent are active. Records last use at most once per resolution interval."""
    now = now or timezone.now()
    match = KEY_PATTERN.match(plain or "")
    key = None
    if match:
        key = ApiKey.objects.select_related("tenant", "agent").filter(key_id=match.group(1)).first()
    # Compare even when no row was found, so the answer takes the same time either way.
    expected = key.secret_hash if key else "0" * 64
    if not hmac.compare_digest(expected, _key_hash(plain or "")) or key is None:
        raise AuthenticationFailed("Incorrect API key provided.")
    if not key.is_usable_at(now):
        raise AuthenticationFailed("This API key is revoked or expired.")
    if not key.tenant.is_active:
        raise PermissionDenied("This tenant is suspended.")
    if not key.agent.is_active:
        raise PermissionDenied("This key's agent is deactivated.")
    resolution = timedelta(seconds=settings.FAIRLANE_KEY_LAST_USED_RESOLUTION_SECONDS)
    if key.last_used_at is None or key.last_used_at < now - resolution:
        ApiKey.objects.filter(pk=key.pk).update(last_used_at=now)
        key.last_used_at = now
    return key


def api_key_revoke(*, key: ApiKey) -> ApiKey:
    """Revoke at once; idempotent."""
    if key.revoked_at is None:
        before = snapshot(key)
        with transaction.atomic():
            key.revoked_at = timezone.now()
            key.save(update_fields=["revoked_at"])
            audit_change("api_key.revoke", key, before=before)
        logger.info("api key revoked: %s", key.prefix)
    return key


def api_key_rotate(
    *,
    key: ApiKey,
    grace_seconds: int,
    created_by: User | None = None,
    actor_role: str = Role.OWNER,
) -> tuple[ApiKey, str]:
    """Issue a replacement with the same agent, name and scopes; the old key keeps working for
    `grace_seconds` (0: stops at once) so clients can be switched without downtime."""
    if (
        isinstance(grace_seconds, bool)
        or not isinstance(grace_seconds, int)
        or not (0 <= grace_seconds <= MAX_GRACE_SECONDS)
    ):
        raise InvalidRequest(
            f"grace_seconds must be an integer from 0 to {MAX_GRACE_SECONDS}.",
            param="grace_seconds",
        )
    now = timezone.now()
    if not key.is_usable_at(now):
        raise Conflict("Only a usable key can be rotated.")  # revoked or expired: its state
    with transaction.atomic():
        new_key, plain = api_key_create(
            tenant=key.tenant,
            agent=key.agent,
            name=key.name,
            scopes=key.scopes,
            expires_at=key.expires_at,
            created_by=created_by,
            actor_role=actor_role,
            rpm_limit=key.rpm_limit,
            tpm_limit=key.tpm_limit,
            concurrency_limit=key.concurrency_limit,
        )
        new_key.rotated_from = key
        new_key.save(update_fields=["rotated_from"])
        grace_end = now + timedelta(seconds=grace_seconds)
        before = snapshot(key)
        if grace_seconds == 0:
            key.revoked_at = now
        elif key.expires_at is None or key.expires_at > grace_end:
            key.expires_at = grace_end
        key.save(update_fields=["revoked_at", "expires_at"])
        audit_change("api_key.rotate", key, before=before)
    return new_key, plain
