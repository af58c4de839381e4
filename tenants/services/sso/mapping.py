"""Which tenants, with which roles, a person's claims give: `domain:` rules match the email's
domain (only an address the provider says it verified), `group:` rules a value of the groups
claim. Several rules may give one tenant: the highest role wins. `ops` is the ops dashboard."""

from __future__ import annotations

from dataclasses import dataclass, field

from tenants.models import ROLE_RANK
from tenants.services.sso.providers import Provider


@dataclass(slots=True)
class Mapped:
    roles: dict[str, str] = field(default_factory=dict)  # tenant slug -> role
    ops: bool = False

    def __bool__(self) -> bool:
        return bool(self.roles) or self.ops


def _groups(claims: dict, name: str) -> set[str]:
    value = claims.get(name)
    if isinstance(value, str):
        return {value}
    if isinstance(value, list):
        return {str(v) for v in value}
    return set()


def claims_map(provider: Provider, claims: dict) -> Mapped:
    email = claims.get("email") if isinstance(claims.get("email"), str) else ""
    verified = claims.get("email_verified") in (True, "true", "True")
    domain = email.rpartition("@")[2].lower() if email and verified and "@" in email else ""
    groups = _groups(claims, provider.groups_claim)
    mapped = Mapped()
    for kind, value, slug, role in provider.rules:
        if not (
            (kind == "domain" and domain and domain == value)
            or (kind == "group" and value in groups)
        ):
            continue
        if role == "ops":
            mapped.ops = True
        elif ROLE_RANK[role] > ROLE_RANK.get(mapped.roles.get(slug, ""), 0):
            mapped.roles[slug] = role
    return mapped
