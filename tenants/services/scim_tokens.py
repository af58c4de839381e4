"""A tenant's SCIM bearer tokens: `scim-<token_id>-<secret>`, shown once at creation, stored as
a keyed hash (HMAC-SHA256 with FAIRLANE_API_KEY_PEPPER, like API keys), compared in constant
time, revoked at once."""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import string

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from tenants.errors import AuthenticationFailed, NotFound
from tenants.models import ScimToken, Tenant
from tenants.services.audit import audit_change, snapshot

TOKEN_PATTERN = re.compile(r"^scim-([a-z0-9]{12})-([A-Za-z0-9]{43})$")


def _hash(plain: str) -> str:
    return hmac.new(
        settings.FAIRLANE_API_KEY_PEPPER.encode(), plain.encode(), hashlib.sha256
    ).hexdigest()


def _random(alphabet: str, length: int) -> str:
    return "".join(secrets.choice(alphabet) for _ in range(length))


def scim_token_create(
    *, tenant: Tenant, name: str = "", created_by: User | None = None
) -> tuple[ScimToken, str]:
    """A new token for the tenant's identity provider; the plain token is returned once."""
    token_id = _random(string.ascii_lowercase + string.digits, 12)
    plain = f"scim-{token_id}-{_random(string.ascii_letters + string.digits, 43)}"
    with transaction.atomic():
        token = ScimToken.objects.create(
            tenant=tenant,
            name=name[:100],
            token_id=token_id,
            secret_hash=_hash(plain),
            created_by=created_by,
        )
        audit_change("scim_token.create", token)
    return token, plain


def scim_token_revoke(*, tenant: Tenant, token_id) -> ScimToken:
    token = ScimToken.objects.filter(tenant=tenant, pk=token_id).first()
    if token is None:
        raise NotFound("No such SCIM token.")
    if token.revoked_at is None:
        before = snapshot(token)
        with transaction.atomic():
            token.revoked_at = timezone.now()
            token.save(update_fields=["revoked_at"])
            audit_change("scim_token.revoke", token, before=before)
    return token


def scim_token_authenticate(*, plain: str) -> ScimToken:
    """The live token `plain` is, with its tenant; AuthenticationFailed otherwise (the same
    time whether or not the id exists)."""
    match = TOKEN_PATTERN.match(plain or "")
    token = (
        ScimToken.objects.select_related("tenant").filter(token_id=match.group(1)).first()
        if match
        else None
    )
    expected = token.secret_hash if token else "0" * 64
    if (
        not hmac.compare_digest(expected, _hash(plain or ""))
        or token is None
        or token.revoked_at is not None
        or not token.tenant.is_active
    ):
        raise AuthenticationFailed("Invalid or revoked SCIM token.")
    now = timezone.now()
    if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
        ScimToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token


def scim_token_list(*, tenant: Tenant):
    return ScimToken.objects.filter(tenant=tenant).select_related("created_by")
