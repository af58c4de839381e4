"""The authentication backend for the callback: mozilla-django-oidc's code exchange, nonce
check and signature check against the provider's keys, with the provider chosen per request
(the callback view puts it on the request: the backend does nothing for any other call), and
the ID token fully verified: issuer, audience (and `azp` with several), expiry, issued-at."""

from __future__ import annotations

import jwt
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.core.exceptions import SuspiciousOperation
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from mozilla_django_oidc.utils import import_from_settings

from tenants.services.sso import SsoRefused, sso_sign_in
from tenants.services.sso.providers import Provider, discovery

LEEWAY_SECONDS = 60


def provider_setting(provider: Provider | None, config: dict, attr: str, *default):
    """mozilla-django-oidc's settings, answered per provider."""
    if provider is not None:
        methods = config.get("token_endpoint_auth_methods_supported") or []
        values = {
            "OIDC_RP_CLIENT_ID": provider.client_id,
            "OIDC_RP_CLIENT_SECRET": provider.client_secret,
            "OIDC_RP_SCOPES": provider.scopes,
            "OIDC_USE_PKCE": provider.pkce,
            "OIDC_RP_SIGN_ALGO": provider.sign_algo,
            "OIDC_TOKEN_USE_BASIC_AUTH": bool(methods) and "client_secret_post" not in methods,
        }
        if attr in values:
            return values[attr]
    fixed = {
        "OIDC_USE_NONCE": True,
        "OIDC_ALLOW_UNSECURED_JWT": False,
        "OIDC_STORE_ACCESS_TOKEN": False,
        "OIDC_STORE_ID_TOKEN": False,
        "OIDC_TIMEOUT": settings.FAIRLANE_OIDC_TIMEOUT_SECONDS,
        "OIDC_AUTHENTICATION_CALLBACK_URL": "oidc_authentication_callback",
        "LOGIN_REDIRECT_URL": settings.LOGIN_REDIRECT_URL,
    }
    if attr in fixed:
        return fixed[attr]
    return import_from_settings(attr, *default)


class OidcBackend(OIDCAuthenticationBackend):
    def __init__(self, *args, **kwargs):  # the provider is known per request, not here
        self.UserModel = get_user_model()
        self.provider, self.config = None, {}

    def get_settings(self, attr, *args):
        return provider_setting(self.provider, self.config, attr, *args)

    def authenticate(self, request, **kwargs):
        provider = getattr(request, "fl_oidc_provider", None) if request is not None else None
        if provider is None or "nonce" not in kwargs:
            return None
        self.provider, self.config = provider, discovery(provider)
        self.OIDC_OP_TOKEN_ENDPOINT = self.config["token_endpoint"]
        self.OIDC_OP_USER_ENDPOINT = self.config.get("userinfo_endpoint")
        self.OIDC_OP_JWKS_ENDPOINT = self.config["jwks_uri"]
        self.OIDC_RP_CLIENT_ID = provider.client_id
        self.OIDC_RP_CLIENT_SECRET = provider.client_secret
        self.OIDC_RP_SIGN_ALGO = provider.sign_algo
        self.OIDC_RP_IDP_SIGN_KEY = None
        return super().authenticate(request, **kwargs)

    def get_payload_data(self, token, key):
        """The ID token's claims once its signature, issuer, audience and times hold."""
        header = jwt.get_unverified_header(token)
        if header.get("alg") != self.provider.sign_algo:
            raise SuspiciousOperation(
                f"ID token signed with {header.get('alg')!r}, expected {self.provider.sign_algo}"
            )
        try:
            claims = jwt.decode(
                token,
                key,
                algorithms=[self.provider.sign_algo],
                audience=self.provider.client_id,
                issuer=self.config["issuer"],
                leeway=LEEWAY_SECONDS,
                options={"require": ["exp", "iat", "iss", "aud", "sub"]},
            )
        except jwt.PyJWTError as exc:
            raise SuspiciousOperation(f"ID token refused: {exc}") from None
        audiences = claims["aud"] if isinstance(claims["aud"], list) else [claims["aud"]]
        if len(audiences) > 1 and claims.get("azp") != self.provider.client_id:
            raise SuspiciousOperation("ID token for several audiences without our azp")
        return claims

    def get_userinfo(self, access_token, id_token, payload):
        """The ID token's claims, completed by the userinfo endpoint's (which must be about the
        same subject); the ID token's verified claims win."""
        info = {}
        if self.OIDC_OP_USER_ENDPOINT:
            info = super().get_userinfo(access_token, id_token, payload)
            if info.get("sub") != payload.get("sub"):
                raise SuspiciousOperation("userinfo is about another subject")
        return {**info, **payload}

    def verify_claims(self, claims):
        return bool(claims.get("sub"))

    def get_or_create_user(self, access_token, id_token, payload):
        claims = self.get_userinfo(access_token, id_token, payload)
        try:
            user = sso_sign_in(provider=self.provider, claims=claims)
        except SsoRefused as exc:
            self.request.fl_sso_refusal = str(exc)
            return None
        user.sso_provider = self.provider.id  # the session remembers it came through SSO
        return user

    get_user = ModelBackend.get_user  # only active accounts keep their sessions
