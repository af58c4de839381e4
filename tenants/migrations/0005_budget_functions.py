"""The budget hold and the settlement as PostgreSQL functions: each is one round trip and one
short transaction, so concurrent requests of one agent wait on its window rows for
microseconds rather than for a dozen ORM statements (tenants/services/budget_sql.py calls them;
SQLite keeps the ORM path). Their rules are the ones tenants/services/budgets.py and
settlement.py document: both windows or neither, the agent's window locked before the
tenant's, the reservation row before the windows, and a settlement never charging past a
limit."""

from django.db import migrations

HOLD = """
CREATE OR REPLACE FUNCTION fairlane_budget_hold(
    p_id uuid, p_request_id varchar, p_tenant bigint, p_agent uuid, p_key uuid,
    p_amount bigint, p_agent_window bigint, p_tenant_window bigint,
    p_now timestamptz, p_expires timestamptz) RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
    IF p_agent_window IS NOT NULL THEN
        UPDATE tenants_budgetwindow w SET reserved_microcents = w.reserved_microcents + p_amount
        FROM tenants_budget b
        WHERE w.id = p_agent_window AND b.id = w.budget_id
          AND w.spent_microcents + w.reserved_microcents + p_amount <= b.limit_microcents;
        IF NOT FOUND THEN RETURN 'agent'; END IF;
    END IF;
    IF p_tenant_window IS NOT NULL THEN
        UPDATE tenants_budgetwindow w SET reserved_microcents = w.reserved_microcents + p_amount
        FROM tenants_budget b
        WHERE w.id = p_tenant_window AND b.id = w.budget_id
          AND w.spent_microcents + w.reserved_microcents + p_amount <= b.limit_microcents;
        IF NOT FOUND THEN  -- both or neither: give the agent's window back (still locked)
            UPDATE tenants_budgetwindow SET reserved_microcents = reserved_microcents - p_amount
            WHERE id = p_agent_window;
            RETURN 'tenant';
        END IF;
    END IF;
    INSERT INTO tenants_reservation (id, request_id, tenant_id, agent_id, api_key_id,
        amount_microcents, agent_window_id, tenant_window_id, status, created_at, expires_at)
    VALUES (p_id, p_request_id, p_tenant, p_agent, p_key, p_amount, p_agent_window,
        p_tenant_window, 'held', p_now, p_expires);
    RETURN '';
END $$;
"""

SETTLE = """
CREATE OR REPLACE FUNCTION fairlane_budget_settle(
    p_request_id varchar, p_tenant bigint, p_cost bigint, p_backend varchar, p_model varchar,
    p_prompt integer, p_completion integer, p_cached integer, p_latency integer,
    p_status varchar, p_now timestamptz,
    OUT outcome text, OUT charge bigint, OUT held bigint, OUT prior text, OUT usage_id bigint,
    OUT agent_id uuid, OUT api_key_id uuid, OUT agent_window bigint, OUT tenant_window bigint,
    OUT agent_spent bigint, OUT tenant_spent bigint)
LANGUAGE plpgsql AS $$
DECLARE
    r tenants_reservation%ROWTYPE;
    w record;
    room bigint;
BEGIN
    SELECT * INTO r FROM tenants_reservation
    WHERE tenant_id = p_tenant AND request_id = p_request_id FOR UPDATE;
    IF NOT FOUND THEN outcome := 'missing'; RETURN; END IF;
    prior := r.status;
    agent_id := r.agent_id; api_key_id := r.api_key_id;
    agent_window := r.agent_window_id; tenant_window := r.tenant_window_id;
    IF r.status = 'settled' THEN
        outcome := 'settled';
        SELECT id INTO usage_id FROM tenants_usagerecord WHERE request_id = p_request_id;
        RETURN;
    END IF;
    held := CASE WHEN r.status = 'held' THEN r.amount_microcents ELSE 0 END;
    charge := p_cost;
    FOR w IN SELECT bw.spent_microcents, bw.reserved_microcents, b.limit_microcents
             FROM tenants_budgetwindow bw JOIN tenants_budget b ON b.id = bw.budget_id
             WHERE bw.id IN (r.agent_window_id, r.tenant_window_id)
             ORDER BY bw.id = r.tenant_window_id  -- the agent's first
             FOR UPDATE OF bw LOOP
        room := w.limit_microcents - w.spent_microcents - (w.reserved_microcents - held);
        charge := GREATEST(LEAST(charge, room), 0);
    END LOOP;
    UPDATE tenants_budgetwindow
    SET reserved_microcents = reserved_microcents - held, spent_microcents = spent_microcents + charge
    WHERE id = r.agent_window_id RETURNING spent_microcents INTO agent_spent;
    UPDATE tenants_budgetwindow
    SET reserved_microcents = reserved_microcents - held, spent_microcents = spent_microcents + charge
    WHERE id = r.tenant_window_id RETURNING spent_microcents INTO tenant_spent;
    UPDATE tenants_reservation SET status = 'settled', closed_at = p_now WHERE id = r.id;
    INSERT INTO tenants_usagerecord (request_id, tenant_id, agent_id, api_key_id, backend,
        model, prompt_tokens, completion_tokens, cached_tokens, cost_microcents,
        unbilled_microcents, latency_ms, status, created_at)
    VALUES (p_request_id, p_tenant, r.agent_id, r.api_key_id, p_backend, p_model, p_prompt,
        p_completion, p_cached, charge, p_cost - charge, p_latency, p_status, p_now)
    RETURNING id INTO usage_id;
    outcome := 'ok';
END $$;
"""

DROP = """
DROP FUNCTION IF EXISTS fairlane_budget_hold(uuid, varchar, bigint, uuid, uuid, bigint, bigint,
    bigint, timestamptz, timestamptz);
DROP FUNCTION IF EXISTS fairlane_budget_settle(varchar, bigint, bigint, varchar, varchar,
    integer, integer, integer, integer, varchar, timestamptz);
"""


def _run(sql: str):
    def operation(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(sql, params=None)

    return operation


class Migration(migrations.Migration):
    dependencies = [("tenants", "0004_budget_alerts")]

    operations = [migrations.RunPython(_run(HOLD + SETTLE), _run(DROP), elidable=False)]
