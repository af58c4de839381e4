from django.urls import path

from tenants.sso import views

urlpatterns = [
    path("<slug:provider>/login/", views.SsoLoginView.as_view(), name="oidc_login"),
    path("callback/", views.SsoCallbackView.as_view(), name="oidc_authentication_callback"),
]
