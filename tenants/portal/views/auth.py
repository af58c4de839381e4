"""Sign in and out, password change and reset (Django's auth views with the portal's
templates), failed sign-ins throttled; and the portal's home: the tenants you belong to."""

from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.contrib.auth.forms import AuthenticationForm
from django.core.exceptions import ValidationError
from django.shortcuts import redirect, render
from django.urls import reverse_lazy

from tenants import selectors
from tenants.portal.throttle import login_blocked, login_failed, login_succeeded

THROTTLED = ("Too many failed sign-ins. Wait a few minutes and try again, or reset your "
             "password.")


class ThrottledAuthenticationForm(AuthenticationForm):
    """Refuses to even check a password while the username or address is throttled, and
    counts each failure."""

    def clean(self):
        username = self.data.get("username", "")
        address = self.request.META.get("REMOTE_ADDR", "") if self.request else ""
        if login_blocked(username=username, address=address):
            raise ValidationError(THROTTLED, code="throttled")
        try:
            cleaned = super().clean()
        except ValidationError:
            login_failed(username=username, address=address)
            raise
        login_succeeded(username=username)
        return cleaned


class LoginView(auth_views.LoginView):
    template_name = "portal/auth/login.html"
    authentication_form = ThrottledAuthenticationForm
    redirect_authenticated_user = True

    def form_invalid(self, form):
        response = super().form_invalid(form)
        if form.has_error("__all__", code="throttled"):
            response.status_code = 429
        return response


class PasswordChangeView(auth_views.PasswordChangeView):
    template_name = "portal/auth/password_change.html"
    success_url = reverse_lazy("portal:password_change_done")


class PasswordChangeDoneView(auth_views.PasswordChangeDoneView):
    template_name = "portal/auth/password_change_done.html"


class PasswordResetView(auth_views.PasswordResetView):
    template_name = "portal/auth/password_reset.html"
    email_template_name = "portal/auth/password_reset_email.txt"
    subject_template_name = "portal/auth/password_reset_subject.txt"
    success_url = reverse_lazy("portal:password_reset_done")


class PasswordResetDoneView(auth_views.PasswordResetDoneView):
    template_name = "portal/auth/password_reset_done.html"


class PasswordResetConfirmView(auth_views.PasswordResetConfirmView):
    template_name = "portal/auth/password_reset_confirm.html"
    success_url = reverse_lazy("portal:password_reset_complete")


class PasswordResetCompleteView(auth_views.PasswordResetCompleteView):
    template_name = "portal/auth/password_reset_complete.html"


@login_required
def home(request):
    """Straight to your tenant when you have one; a list to pick from when you have several."""
    tenants = list(selectors.tenant_list(user=request.user))
    if len(tenants) == 1:
        return redirect("portal:overview", slug=tenants[0].slug)
    return render(request, "portal/tenants/choose.html", {"my_tenants": tenants})
