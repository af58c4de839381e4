"""`make run`'s demo_setup creates a portal user for the demo tenant and prints its password
once; that user signs in and reaches the demo tenant's pages."""

import io
import re

from django.core.management import call_command
from django.test import Client


def test_demo_setup_prints_the_portal_users_password_once_and_it_signs_in(db):
    first = io.StringIO()
    call_command("demo_setup", "--base-url", "http://127.0.0.1:8000", stdout=first)
    match = re.search(r"Portal user: demo / (\S+)   \(shown once\)", first.getvalue())
    assert match and "http://127.0.0.1:8000/portal/" in first.getvalue()
    client = Client()
    response = client.post(
        "/portal/login/", {"username": "demo", "password": match[1]}, follow=True
    )
    assert response.redirect_chain[-1][0] == "/portal/t/demo/"
    assert (
        b"demo-agent" in response.content and b'<span class="role">admin</span>' in response.content
    )
    again = io.StringIO()
    call_command("demo_setup", stdout=again)
    assert match[1] not in again.getvalue() and "Portal user: demo (exists" in again.getvalue()


def test_demo_setup_goes_on_when_the_demo_agent_was_deactivated(db):
    # Issue 28: after a user deactivated demo-agent in the portal (its keys revoked), the next
    # `make run` died in demo_setup with a traceback and never served.
    from tenants.models import Agent
    from tenants.services.tenancy import agent_deactivate

    call_command("demo_setup", stdout=io.StringIO())
    agent_deactivate(agent=Agent.objects.get(name="demo-agent"))
    again = io.StringIO()
    call_command("demo_setup", "--new-key", stdout=again)
    out = again.getvalue()
    assert "Fairlane is ready." in out and "demo-agent is deactivated" in out
    assert not re.search(r"fl-[a-z0-9]{12}-[A-Za-z0-9]{43}", out)  # no key for a dead agent
