"""Reads the portal needs and the API lacks: spend against budgets with a run-rate
projection, and usage aggregated by hour or day in the database. Every function takes the
tenant; nothing here writes."""
