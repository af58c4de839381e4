"""Single sign-on with OpenID Connect, on mozilla-django-oidc (state, nonce, PKCE, the ID
token's signature checked against the provider's keys), with what Fairlane adds: several
providers configured from the environment, issuer discovery, the ID token's issuer, audience
and expiry checked, and tenants and roles mapped from claims (docs/security.md)."""
