"""Holds and settlements in batches (tenants/services/group_commit.py): one statement runs many
calls of migration 0005's functions (0006's settlement), in order, in one transaction. The
rules stay in those functions; a batch only locks, up front and in one global order, every
row its calls will lock (reservations, then agents' windows, then tenants' windows, each by
id), so that two batches, or a batch and a single call, never wait for each other in a circle.

A hold whose request id already has a reservation answers 'duplicate' instead of aborting the
batch (the single call raises; the caller is told the same)."""

from importlib import import_module

from django.db import migrations

_0005 = import_module("tenants.migrations.0005_budget_functions")

FUNCTIONS = """
CREATE OR REPLACE FUNCTION fairlane_budget_hold_many(
    p_ids uuid[], p_request_ids varchar[], p_tenants bigint[], p_agents uuid[], p_keys uuid[],
    p_amounts bigint[], p_agent_windows bigint[], p_tenant_windows bigint[],
    p_nows timestamptz[], p_expires timestamptz[]) RETURNS SETOF text
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM tenants_budgetwindow WHERE id = ANY(p_agent_windows) ORDER BY id FOR UPDATE;
    PERFORM 1 FROM tenants_budgetwindow WHERE id = ANY(p_tenant_windows) ORDER BY id FOR UPDATE;
    FOR i IN 1 .. coalesce(array_length(p_ids, 1), 0) LOOP
        IF EXISTS (SELECT 1 FROM tenants_reservation WHERE request_id = p_request_ids[i]) THEN
            RETURN NEXT 'duplicate';
        ELSE
            RETURN NEXT fairlane_budget_hold(p_ids[i], p_request_ids[i], p_tenants[i],
                p_agents[i], p_keys[i], p_amounts[i], p_agent_windows[i], p_tenant_windows[i],
                p_nows[i], p_expires[i]);
        END IF;
    END LOOP;
END $$;

CREATE OR REPLACE FUNCTION fairlane_budget_settle_many(
    p_request_ids varchar[], p_tenants bigint[], p_costs bigint[], p_backends varchar[],
    p_models varchar[], p_prompts integer[], p_completions integer[], p_cached integer[],
    p_latencies integer[], p_statuses varchar[], p_nows timestamptz[], p_traces varchar[],
    p_versions varchar[], p_timelines jsonb[])
RETURNS TABLE (outcome text, charge bigint, held bigint, prior text, usage_id bigint,
    agent_id uuid, api_key_id uuid, agent_window bigint, tenant_window bigint,
    agent_spent bigint, tenant_spent bigint)
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM tenants_reservation r WHERE r.request_id = ANY(p_request_ids)
        ORDER BY r.id FOR UPDATE;
    PERFORM 1 FROM tenants_budgetwindow w WHERE w.id IN (
        SELECT r.agent_window_id FROM tenants_reservation r WHERE r.request_id = ANY(p_request_ids))
        ORDER BY w.id FOR UPDATE;
    PERFORM 1 FROM tenants_budgetwindow w WHERE w.id IN (
        SELECT r.tenant_window_id FROM tenants_reservation r WHERE r.request_id = ANY(p_request_ids))
        ORDER BY w.id FOR UPDATE;
    FOR i IN 1 .. coalesce(array_length(p_request_ids, 1), 0) LOOP
        RETURN QUERY SELECT * FROM fairlane_budget_settle(p_request_ids[i], p_tenants[i],
            p_costs[i], p_backends[i], p_models[i], p_prompts[i], p_completions[i], p_cached[i],
            p_latencies[i], p_statuses[i], p_nows[i], p_traces[i], p_versions[i], p_timelines[i]);
    END LOOP;
END $$;
"""

DROP = """
DROP FUNCTION IF EXISTS fairlane_budget_hold_many(uuid[], varchar[], bigint[], uuid[], uuid[],
    bigint[], bigint[], bigint[], timestamptz[], timestamptz[]);
DROP FUNCTION IF EXISTS fairlane_budget_settle_many(varchar[], bigint[], bigint[], varchar[],
    varchar[], integer[], integer[], integer[], integer[], varchar[], timestamptz[], varchar[],
    varchar[], jsonb[]);
"""


class Migration(migrations.Migration):
    dependencies = [("tenants", "0006_ledger_trace_version")]

    operations = [migrations.RunPython(_0005._run(FUNCTIONS), _0005._run(DROP), elidable=False)]
