"""One throttle for every sign-in form: the portal's (which the ops dashboard uses), the Django
admin's, and password reset. Failures are counted per username and per client address in the
shared cache (Redis when configured, so every API process counts together), for
FAIRLANE_LOGIN_WINDOW_SECONDS. While either count is at its limit, the form refuses to check
a password at all, and answers 429.

The address is the connection's (REMOTE_ADDR): uvicorn replaces it with X-Forwarded-For only
from the proxies FORWARDED_ALLOW_IPS names (none by default), so a client cannot rotate it.
A password reset request counts against its address and its email like a failure: it sends
mail, and guessing through it must cost the same as guessing at the sign-in form."""

from __future__ import annotations

import hashlib

from django.conf import settings
from django.contrib import admin
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.forms import AuthenticationForm, PasswordResetForm
from django.core.cache import cache
from django.core.exceptions import ValidationError

from tenants.models import Membership

PREFIX = "fl:login-fail:"
THROTTLED = "Too many failed sign-ins. Wait a few minutes and try again, or reset your password."
RESET_THROTTLED = "Too many requests from here. Wait a few minutes and try again."


def _keys(*, username: str, address: str) -> list[str]:
    def digest(value: str) -> str:  # usernames are not written into the cache as they are
        return hashlib.sha256(value.encode()).hexdigest()[:32]

    return [f"{PREFIX}u:{digest(username.strip().lower())}", f"{PREFIX}a:{digest(address)}"]


def login_blocked(*, username: str, address: str) -> bool:
    counts = cache.get_many(_keys(username=username, address=address))
    # The address allows several people behind one NAT a few more tries than one username.
    limit = settings.FAIRLANE_LOGIN_MAX_FAILURES
    return any(count >= (limit if ":u:" in key else limit * 4) for key, count in counts.items())


def login_failed(*, username: str, address: str) -> None:
    for key in _keys(username=username, address=address):
        if cache.add(key, 1, timeout=settings.FAIRLANE_LOGIN_WINDOW_SECONDS):
            continue
        try:
            cache.incr(key)
        except ValueError:  # expired between add and incr
            cache.add(key, 1, timeout=settings.FAIRLANE_LOGIN_WINDOW_SECONDS)


def login_succeeded(*, username: str) -> None:
    cache.delete(_keys(username=username, address="")[0])


def _address(request) -> str:
    return request.META.get("REMOTE_ADDR", "") if request is not None else ""


class ThrottledAuthentication:
    """For an AuthenticationForm: refuses to even check a password while the username or the
    address is throttled, and counts each failure."""

    def clean(self):
        username = self.data.get("username", "")
        address = _address(self.request)
        if login_blocked(username=username, address=address):
            raise ValidationError(THROTTLED, code="throttled")
        try:
            cleaned = super().clean()
        except ValidationError:
            login_failed(username=username, address=address)
            raise
        login_succeeded(username=username)
        return cleaned


SSO_ONLY = (
    "Your organisation signs in with single sign-on only: use the button for your "
    "identity provider below."
)


class ThrottledAuthenticationForm(ThrottledAuthentication, AuthenticationForm):
    """The portal's password form: refused to a person whose every tenant is SSO-only
    (operators keep their local password for the ops dashboard and the admin)."""

    def confirm_login_allowed(self, user):
        super().confirm_login_allowed(user)
        tenants = Membership.objects.filter(user=user, is_active=True).values_list(
            "tenant__sso_only", flat=True
        )
        if not user.is_staff and tenants and all(tenants):
            raise ValidationError(SSO_ONLY, code="sso_only")


class ThrottledAdminAuthenticationForm(ThrottledAuthentication, AdminAuthenticationForm):
    pass


class ThrottledPasswordResetForm(PasswordResetForm):
    """Each request counts against the address and the email; a throttled one sends nothing."""

    def __init__(self, *args, request=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.request = request

    def clean(self):
        cleaned = super().clean()
        email, address = cleaned.get("email", ""), _address(self.request)
        if login_blocked(username=f"reset:{email}", address=address):
            raise ValidationError(RESET_THROTTLED, code="throttled")
        login_failed(username=f"reset:{email}", address=address)
        return cleaned


def throttled_status(response):
    """429 for a sign-in page whose form was refused by the throttle."""
    form = (getattr(response, "context_data", None) or {}).get("form")
    if form is not None and form.has_error("__all__", code="throttled"):
        response.status_code = 429
    return response


class FairlaneAdminSite(admin.AdminSite):
    """The Django admin, its sign-in under the same throttle as the portal's. It stays on
    local staff accounts: a session that came through single sign-on is not let in, whatever
    the account (the ops dashboard takes it)."""

    login_form = ThrottledAdminAuthenticationForm

    def has_permission(self, request):
        return super().has_permission(request) and not request.session.get("fl_sso")

    def login(self, request, extra_context=None):
        return throttled_status(super().login(request, extra_context))
