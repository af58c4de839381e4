"""The tenant self-service portal: server-rendered pages (Django templates, htmx) where
members manage agents, budgets, keys and members, watch usage and try models. Reads go
through selectors that take the tenant, writes through the API's own services."""
