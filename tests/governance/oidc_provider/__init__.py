"""A tiny OpenID provider for the single sign-on tests: django-oauth-toolkit in a Django
process of its own (its own SQLite database), started by the tests on a free port."""
