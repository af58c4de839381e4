"""Writes and workflows of the tenancy core, split by subdomain."""
