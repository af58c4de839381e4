"""Sign-in through an identity provider: /oidc/<provider>/login/ sends the browser there with
state, nonce and a PKCE challenge (mozilla-django-oidc's); /oidc/callback/ takes the answer,
whose state names the provider it was started for. Every refusal is a page that says why."""

from __future__ import annotations

import logging
from urllib.parse import parse_qs, urlparse

import requests
from django.core.exceptions import SuspiciousOperation
from django.http import Http404
from django.shortcuts import render
from django.views.generic import View
from mozilla_django_oidc.views import (
    OIDCAuthenticationCallbackView,
    OIDCAuthenticationRequestView,
)

from tenants.services.sso.providers import ProviderUnavailable, discovery, provider_get
from tenants.sso.backend import provider_setting

logger = logging.getLogger(__name__)
STATE_PROVIDERS = "fl_oidc_state_providers"
NOT_VERIFIED = (
    "Your identity provider's answer could not be verified, so you were not signed "
    "in. Start again; if it keeps happening, tell your administrator."
)
UNREACHABLE = "The identity provider cannot be reached right now. Try again in a minute."


def refusal(request, message: str, *, status: int):
    return render(request, "portal/auth/sso_refused.html", {"message": message}, status=status)


class SsoLoginView(OIDCAuthenticationRequestView):
    def __init__(self, **kwargs):
        View.__init__(self, **kwargs)
        self.provider, self.config = None, {}

    def get_settings(self, attr, *args):
        return provider_setting(self.provider, self.config, attr, *args)

    def get(self, request, provider):
        self.provider = provider_get(provider)
        if self.provider is None:
            raise Http404("No such identity provider.")
        try:
            self.config = discovery(self.provider)
        except ProviderUnavailable as exc:
            logger.warning("single sign-on: %s", exc)
            return refusal(request, UNREACHABLE, status=503)
        self.OIDC_OP_AUTH_ENDPOINT = self.config["authorization_endpoint"]
        self.OIDC_RP_CLIENT_ID = self.provider.client_id
        response = super().get(request)
        state = parse_qs(urlparse(response.url).query)["state"][0]
        states = request.session.get(STATE_PROVIDERS, {})
        states = dict(list(states.items())[-20:])  # a few parallel sign-ins, no more
        states[state] = self.provider.id
        request.session[STATE_PROVIDERS] = states
        return response


class SsoCallbackView(OIDCAuthenticationCallbackView):
    provider = None

    def get_settings(self, attr, *args):
        return provider_setting(self.provider, {}, attr, *args)

    def get(self, request):
        states = request.session.get(STATE_PROVIDERS, {})
        self.provider = provider_get(states.pop(request.GET.get("state", ""), None))
        request.session[STATE_PROVIDERS] = states
        if self.provider is None:
            return refusal(
                request,
                "This sign-in was not started here, or was already used: start again.",
                status=400,
            )
        request.fl_oidc_provider = self.provider
        try:
            return super().get(request)
        except SuspiciousOperation as exc:
            logger.warning("single sign-on %s refused: %s", self.provider.id, exc)
            return refusal(request, NOT_VERIFIED, status=403)
        except (requests.RequestException, ProviderUnavailable) as exc:
            logger.warning("single sign-on %s failed: %s", self.provider.id, exc)
            return refusal(request, UNREACHABLE, status=503)

    def login_failure(self):
        reason = getattr(self.request, "fl_sso_refusal", "")
        return refusal(self.request, reason or NOT_VERIFIED, status=403)
