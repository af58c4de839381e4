"""Start the test provider: migrate its database, make the relying party's client and the
people of PROVIDER_PEOPLE (JSON: username -> {email, groups}), then serve on PROVIDER_PORT."""

import json
import os
import sys

import django

os.environ["DJANGO_SETTINGS_MODULE"] = "tests.governance.oidc_provider.settings"
django.setup()

from django.contrib.auth.models import Group, User  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.core.servers.basehttp import run  # noqa: E402
from django.core.wsgi import get_wsgi_application  # noqa: E402
from oauth2_provider.models import Application  # noqa: E402


def setup() -> None:
    call_command("migrate", verbosity=0)
    Application.objects.create(
        name="fairlane",
        client_id=os.environ["PROVIDER_CLIENT_ID"],
        client_secret=os.environ["PROVIDER_CLIENT_SECRET"],
        client_type=Application.CLIENT_CONFIDENTIAL,
        authorization_grant_type=Application.GRANT_AUTHORIZATION_CODE,
        redirect_uris=os.environ["PROVIDER_REDIRECT_URI"],
        skip_authorization=True,
        algorithm=Application.RS256_ALGORITHM,
    )
    for username, person in json.loads(os.environ["PROVIDER_PEOPLE"]).items():
        user = User.objects.create_user(username, email=person["email"], password=f"pw-{username}")
        for name in person.get("groups", []):
            user.groups.add(Group.objects.get_or_create(name=name)[0])


if __name__ == "__main__":
    setup()
    print("provider ready", flush=True)
    run("127.0.0.1", int(os.environ["PROVIDER_PORT"]), get_wsgi_application(), threading=True)
    sys.exit(0)
