"""SCIM 2.0 (RFC 7643/7644) for each tenant's identity provider, on django-scim2: its views,
PATCH parsing, filters and error shape, with Fairlane's adapters (a User is a membership in the
token's tenant, a Group a set of members) and bearer-token authentication per tenant."""
