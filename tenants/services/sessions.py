"""Signing a person out everywhere at once: sessions that began before their cutoff end on
their next request (tenants.middleware). Django keeps sessions in the database, keyed by a
random id, not by user: a cutoff per user finds every one of them without scanning.

A session remembers when it began (`SESSION_STARTED`) and whether it came through single
sign-on and from which provider (`SESSION_SSO`): an SSO-only tenant admits only those."""

from __future__ import annotations

import time

from django.contrib.auth import logout
from django.contrib.auth.models import User
from django.utils import timezone

from tenants.models import SessionCutoff

SESSION_STARTED = "fl_started"
SESSION_SSO = "fl_sso"


def session_started(sender, request, user, **kwargs) -> None:
    """user_logged_in: when the session began, and through which door."""
    if request is None or not hasattr(request, "session"):
        return
    request.session[SESSION_STARTED] = time.time()
    provider = getattr(user, "sso_provider", "")
    if provider:
        request.session[SESSION_SSO] = provider
    else:
        request.session.pop(SESSION_SSO, None)


def user_sessions_end(*, user: User) -> None:
    """Every session `user` has now ends on its next request."""
    SessionCutoff.objects.update_or_create(user=user, defaults={"not_before": timezone.now()})


def session_check(request) -> None:
    """Sign the request's user out when their session began before their cutoff; otherwise
    note on the user object whether the session came through single sign-on."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated or not hasattr(request, "session"):
        return
    cutoff = (
        SessionCutoff.objects.filter(user_id=user.pk).values_list("not_before", flat=True).first()
    )
    started = request.session.get(SESSION_STARTED)
    if cutoff is not None and (started is None or started <= cutoff.timestamp()):
        logout(request)
        return
    user.sso_provider = request.session.get(SESSION_SSO, "")


SSO_REQUIRED = (
    "This tenant signs in with single sign-on only: sign out, then sign in with "
    "your organisation's identity provider."
)


def tenant_needs_sso(*, tenant, user) -> bool:
    """Whether `user`'s session may not act in `tenant`: an SSO-only tenant, and a session
    that did not come through single sign-on (tenants.middleware notes which did)."""
    return bool(tenant.sso_only) and not getattr(user, "sso_provider", "")
