"""The test provider's settings: everything it needs comes from the environment the test
sets (port, database file, RSA key, the relying party's client, the people)."""

import os

SECRET_KEY = "test-provider-only"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
ROOT_URLCONF = "tests.governance.oidc_provider.urls"
INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "oauth2_provider",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "tests.governance.oidc_provider.tamper.TamperMiddleware",
]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ["PROVIDER_DB"]}}
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [os.path.join(os.path.dirname(__file__), "templates")],
        "OPTIONS": {"context_processors": ["django.template.context_processors.request"]},
    }
]
LOGIN_URL = "/login/"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
SESSION_COOKIE_NAME = "providersession"  # the relying party is on the same host
CSRF_COOKIE_NAME = "providercsrf"
OAUTH2_PROVIDER = {
    "OIDC_ENABLED": True,
    "OIDC_RSA_PRIVATE_KEY": os.environ["PROVIDER_RSA_KEY"],
    "OIDC_ISS_ENDPOINT": os.environ["PROVIDER_ISSUER"],
    "PKCE_REQUIRED": True,
    "SCOPES": {"openid": "OpenID", "email": "email", "profile": "profile", "groups": "groups"},
    "OAUTH2_VALIDATOR_CLASS": "tests.governance.oidc_provider.validator.Validator",
}
