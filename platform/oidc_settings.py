"""Single sign-on providers from the environment (docs/configuration.md, single sign-on):

    FAIRLANE_OIDC_PROVIDERS=okta                 # ids, comma-separated (letters, digits, -)
    FAIRLANE_OIDC_OKTA_ISSUER=https://acme.okta.com/oauth2/default
    FAIRLANE_OIDC_OKTA_CLIENT_ID=...             FAIRLANE_OIDC_OKTA_CLIENT_SECRET=...
    FAIRLANE_OIDC_OKTA_NAME="Acme Okta"          # the sign-in button's label
    FAIRLANE_OIDC_OKTA_MAP="domain:acme.com=acme:member; group:fl-admins=acme:admin; group:ops=ops"

Each rule of _MAP reads `domain:<email domain>` or `group:<value of the groups claim>`, then
`=<tenant slug>:<role>` (viewer, member, admin) or `=ops` (the ops dashboard). A bad rule
stops the start with the reason, rather than signing people into the wrong place."""

import os
import re
from typing import Any

from django.core.exceptions import ImproperlyConfigured

ROLES = {"viewer", "member", "admin"}
_ID = re.compile(r"^[a-z0-9][a-z0-9-]{0,39}$")
_RULE = re.compile(r"^(domain|group):([^=]+)=(ops|[A-Za-z0-9_-]+:[a-z]+)$")


def map_rules_parse(text: str, *, name: str) -> list[tuple[str, str, str, str]]:
    """(kind, value, tenant slug or "", role or "ops") for each rule of a _MAP value."""
    rules = []
    for raw in re.split(r"[;\n]", text):
        rule = raw.strip()
        if not rule:
            continue
        match = _RULE.match(rule)
        if match is None:
            raise ImproperlyConfigured(
                f"{name}: cannot read rule {rule!r} (kind:value=slug:role or kind:value=ops)"
            )
        kind, value, target = match.groups()
        if target == "ops":
            rules.append(
                (kind, value.strip().lower() if kind == "domain" else value.strip(), "", "ops")
            )
            continue
        slug, role = target.split(":")
        if role not in ROLES:
            raise ImproperlyConfigured(
                f"{name}: role {role!r} must be one of {sorted(ROLES)} (owners are made by owners)"
            )
        rules.append(
            (kind, value.strip().lower() if kind == "domain" else value.strip(), slug, role)
        )
    return rules


def oidc_providers_from_env(environ=os.environ) -> dict[str, dict]:
    providers = {}
    for provider_id in [
        p.strip() for p in environ.get("FAIRLANE_OIDC_PROVIDERS", "").split(",") if p.strip()
    ]:
        if not _ID.match(provider_id):
            raise ImproperlyConfigured(f"FAIRLANE_OIDC_PROVIDERS: bad id {provider_id!r}")
        prefix = "FAIRLANE_OIDC_" + provider_id.upper().replace("-", "_") + "_"

        def setting(key: str, default: str = "", prefix: str = prefix) -> str:
            return environ.get(prefix + key, "") or default

        config: dict[str, Any] = {
            key: setting(key.upper()) for key in ("issuer", "client_id", "client_secret")
        }
        missing = [prefix + k.upper() for k, v in config.items() if not v]
        if missing:
            raise ImproperlyConfigured(f"single sign-on {provider_id}: set {', '.join(missing)}")
        config.update(
            id=provider_id,
            name=setting("NAME", provider_id),
            scopes=setting("SCOPES", "openid email profile"),
            groups_claim=setting("GROUPS_CLAIM", "groups"),
            sign_algo=setting("SIGN_ALGO", "RS256"),
            pkce=setting("PKCE", "1").lower() not in {"0", "false", "no", "off"},
            rules=map_rules_parse(setting("MAP"), name=prefix + "MAP"),
        )
        providers[provider_id] = config
    return providers
