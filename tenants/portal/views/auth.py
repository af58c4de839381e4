"""Sign in and out, password change and reset (Django's auth views with the portal's
templates), failed sign-ins throttled; and the portal's home: the tenants you belong to."""

from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render
from django.urls import reverse_lazy

from tenants import selectors
from tenants.services.sso.providers import providers
from tenants.signin import (
    ThrottledAuthenticationForm,
    ThrottledPasswordResetForm,
    throttled_status,
)


class LoginView(auth_views.LoginView):
    template_name = "portal/auth/login.html"
    authentication_form = ThrottledAuthenticationForm
    redirect_authenticated_user = True

    def get_context_data(self, **kwargs):
        return {**super().get_context_data(**kwargs), "sso_providers": providers().values()}

    def form_invalid(self, form):
        return throttled_status(super().form_invalid(form))


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
    form_class = ThrottledPasswordResetForm

    def get_form_kwargs(self):
        return {**super().get_form_kwargs(), "request": self.request}

    def form_invalid(self, form):
        return throttled_status(super().form_invalid(form))


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
