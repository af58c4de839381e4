"""Budgets at more scopes (an API key, a member, a model filter on any scope), and the
functions of migrations 0005-0007 holding and settling a request on every window that applies:
the agent's and the tenant's (the primary windows) and the reservation's extra windows, locked
in one global order: the agent's, the tenant's, then the extra windows by id (a batch locks
every agent's window of the batch by id, then every tenant's, then every extra one).

The batch functions no longer call the single ones for each request: they read the batch's
windows once, under their locks, decide each hold or charge in order on those figures (the
same rules as the single functions: all windows or none, the first without room refuses, a
charge capped by the room of every window), and write each window back once. Updating one row
once per request inside one transaction left a chain of row versions that every later update
of the batch walked."""

from importlib import import_module

import django.db.models.deletion
from django.db import migrations, models

_0005 = import_module("tenants.migrations.0005_budget_functions")
_0006 = import_module("tenants.migrations.0006_ledger_trace_version")
_0007 = import_module("tenants.migrations.0007_budget_batches")

HOLD = """
CREATE FUNCTION fairlane_budget_hold(
    p_id uuid, p_request_id varchar, p_tenant bigint, p_agent uuid, p_key uuid,
    p_amount bigint, p_agent_window bigint, p_tenant_window bigint, p_extra jsonb,
    p_model varchar, p_now timestamptz, p_expires timestamptz) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    taken bigint[] := '{}';
    wid bigint;
BEGIN
    IF p_agent_window IS NOT NULL THEN
        UPDATE tenants_budgetwindow w SET reserved_microcents = w.reserved_microcents + p_amount
        FROM tenants_budget b
        WHERE w.id = p_agent_window AND b.id = w.budget_id
          AND w.spent_microcents + w.reserved_microcents + p_amount <= b.limit_microcents;
        IF NOT FOUND THEN RETURN 'agent'; END IF;
        taken := taken || p_agent_window;
    END IF;
    IF p_tenant_window IS NOT NULL THEN
        UPDATE tenants_budgetwindow w SET reserved_microcents = w.reserved_microcents + p_amount
        FROM tenants_budget b
        WHERE w.id = p_tenant_window AND b.id = w.budget_id
          AND w.spent_microcents + w.reserved_microcents + p_amount <= b.limit_microcents;
        IF NOT FOUND THEN  -- all or none: give back what was taken (still locked)
            UPDATE tenants_budgetwindow SET reserved_microcents = reserved_microcents - p_amount
            WHERE id = ANY(taken);
            RETURN 'tenant';
        END IF;
        taken := taken || p_tenant_window;
    END IF;
    IF p_extra IS NOT NULL AND p_extra <> '[]'::jsonb THEN
        FOR wid IN SELECT e::bigint FROM jsonb_array_elements_text(p_extra) e ORDER BY 1 LOOP
            UPDATE tenants_budgetwindow w
            SET reserved_microcents = w.reserved_microcents + p_amount
            FROM tenants_budget b
            WHERE w.id = wid AND b.id = w.budget_id
              AND w.spent_microcents + w.reserved_microcents + p_amount <= b.limit_microcents;
            IF NOT FOUND THEN
                UPDATE tenants_budgetwindow
                SET reserved_microcents = reserved_microcents - p_amount
                WHERE id = ANY(taken);
                RETURN 'window:' || wid;
            END IF;
            taken := taken || wid;
        END LOOP;
    END IF;
    INSERT INTO tenants_reservation (id, request_id, tenant_id, agent_id, api_key_id,
        amount_microcents, agent_window_id, tenant_window_id, extra_windows, model, status,
        created_at, expires_at)
    VALUES (p_id, p_request_id, p_tenant, p_agent, p_key, p_amount, p_agent_window,
        p_tenant_window, coalesce(p_extra, '[]'::jsonb), p_model, 'held', p_now, p_expires);
    RETURN '';
END $$;
"""

SETTLE = """
CREATE FUNCTION fairlane_budget_settle(
    p_request_id varchar, p_tenant bigint, p_cost bigint, p_backend varchar, p_model varchar,
    p_prompt integer, p_completion integer, p_cached integer, p_latency integer,
    p_status varchar, p_now timestamptz, p_trace varchar, p_version varchar, p_timeline jsonb,
    OUT outcome text, OUT charge bigint, OUT held bigint, OUT prior text, OUT usage_id bigint,
    OUT agent_id uuid, OUT api_key_id uuid, OUT agent_window bigint, OUT tenant_window bigint,
    OUT agent_spent bigint, OUT tenant_spent bigint, OUT extra_windows bigint[],
    OUT extra_spent bigint[])
LANGUAGE plpgsql AS $$
DECLARE
    r tenants_reservation%ROWTYPE;
    w record;
    room bigint;
    extra bigint[];
    ids bigint[];
    spents bigint[];
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
    extra := CASE WHEN r.extra_windows = '[]'::jsonb THEN '{}'::bigint[] ELSE ARRAY(
        SELECT e::bigint FROM jsonb_array_elements_text(r.extra_windows) e) END;
    held := CASE WHEN r.status = 'held' THEN r.amount_microcents ELSE 0 END;
    charge := p_cost;
    FOR w IN SELECT bw.spent_microcents, bw.reserved_microcents, b.limit_microcents
             FROM tenants_budgetwindow bw JOIN tenants_budget b ON b.id = bw.budget_id
             WHERE bw.id = ANY(ARRAY[r.agent_window_id, r.tenant_window_id] || extra)
             ORDER BY CASE WHEN bw.id = r.agent_window_id THEN 0
                           WHEN bw.id = r.tenant_window_id THEN 1 ELSE 2 END, bw.id
             FOR UPDATE OF bw LOOP
        room := w.limit_microcents - w.spent_microcents - (w.reserved_microcents - held);
        charge := GREATEST(LEAST(charge, room), 0);
    END LOOP;
    -- Every window in one statement (all are locked already, in order, by the loop above).
    WITH u AS (
        UPDATE tenants_budgetwindow
        SET reserved_microcents = reserved_microcents - held,
            spent_microcents = spent_microcents + charge
        WHERE id = ANY(ARRAY[r.agent_window_id, r.tenant_window_id] || extra)
        RETURNING id, spent_microcents)
    SELECT array_agg(u.id), array_agg(u.spent_microcents) INTO ids, spents FROM u;
    FOR i IN 1 .. coalesce(array_length(ids, 1), 0) LOOP
        IF ids[i] = r.agent_window_id THEN agent_spent := spents[i];
        ELSIF ids[i] = r.tenant_window_id THEN tenant_spent := spents[i];
        ELSE
            extra_windows := coalesce(extra_windows, '{}') || ids[i];
            extra_spent := coalesce(extra_spent, '{}') || spents[i];
        END IF;
    END LOOP;
    UPDATE tenants_reservation SET status = 'settled', closed_at = p_now WHERE id = r.id;
    INSERT INTO tenants_usagerecord (request_id, tenant_id, agent_id, api_key_id, backend,
        model, prompt_tokens, completion_tokens, cached_tokens, cost_microcents,
        unbilled_microcents, latency_ms, status, created_at, trace_id, model_version,
        timeline)
    VALUES (p_request_id, p_tenant, r.agent_id, r.api_key_id, p_backend, p_model, p_prompt,
        p_completion, p_cached, charge, p_cost - charge, p_latency, p_status, p_now, p_trace,
        p_version, p_timeline)
    RETURNING id INTO usage_id;
    outcome := 'ok';
END $$;
"""

MANY = """
CREATE FUNCTION fairlane_budget_hold_many(
    p_ids uuid[], p_request_ids varchar[], p_tenants bigint[], p_agents uuid[], p_keys uuid[],
    p_amounts bigint[], p_agent_windows bigint[], p_tenant_windows bigint[], p_extras jsonb[],
    p_models varchar[], p_nows timestamptz[], p_expires timestamptz[]) RETURNS SETOF text
LANGUAGE plpgsql AS $$
DECLARE
    wids bigint[];   -- the batch's windows
    room bigint[];   -- each one's limit - spent - reserved, as the batch's holds take it
    added bigint[];  -- what the batch holds on each
    mine bigint[];
    labels text[];
    refused text;
    wid bigint;
    k int;
BEGIN
    PERFORM 1 FROM tenants_budgetwindow WHERE id = ANY(p_agent_windows) ORDER BY id FOR UPDATE;
    PERFORM 1 FROM tenants_budgetwindow WHERE id = ANY(p_tenant_windows) ORDER BY id FOR UPDATE;
    PERFORM 1 FROM tenants_budgetwindow WHERE id IN (
        SELECT e::bigint FROM unnest(p_extras) x, jsonb_array_elements_text(x) e)
        ORDER BY id FOR UPDATE;
    -- Read once, locked; every hold of the batch is decided on these figures and written back
    -- in one UPDATE per window (not one row version per hold: a hot window would grow a
    -- chain of versions within the transaction that each later update walks).
    SELECT coalesce(array_agg(w.id), '{}'),
           coalesce(array_agg(b.limit_microcents - w.spent_microcents - w.reserved_microcents),
                    '{}')
    INTO wids, room
    FROM tenants_budgetwindow w JOIN tenants_budget b ON b.id = w.budget_id
    WHERE w.id = ANY(p_agent_windows) OR w.id = ANY(p_tenant_windows) OR w.id IN (
        SELECT e::bigint FROM unnest(p_extras) x, jsonb_array_elements_text(x) e);
    added := array_fill(0::bigint, ARRAY[cardinality(wids)]);
    FOR i IN 1 .. coalesce(array_length(p_ids, 1), 0) LOOP
        IF EXISTS (SELECT 1 FROM tenants_reservation WHERE request_id = p_request_ids[i]) THEN
            RETURN NEXT 'duplicate';
            CONTINUE;
        END IF;
        -- Its windows in the order a single hold takes them: the agent's, the tenant's, the
        -- extra ones by id; the first without room refuses it, and it holds nothing.
        mine := '{}'; labels := '{}';
        IF p_agent_windows[i] IS NOT NULL THEN
            mine := mine || p_agent_windows[i]; labels := labels || 'agent'::text;
        END IF;
        IF p_tenant_windows[i] IS NOT NULL THEN
            mine := mine || p_tenant_windows[i]; labels := labels || 'tenant'::text;
        END IF;
        IF p_extras[i] IS NOT NULL AND p_extras[i] <> '[]'::jsonb THEN
            FOR wid IN SELECT e::bigint FROM jsonb_array_elements_text(p_extras[i]) e ORDER BY 1
            LOOP
                mine := mine || wid; labels := labels || ('window:' || wid);
            END LOOP;
        END IF;
        refused := '';
        FOR j IN 1 .. coalesce(array_length(mine, 1), 0) LOOP
            k := array_position(wids, mine[j]);
            IF k IS NULL OR room[k] < p_amounts[i] THEN
                refused := labels[j];
                EXIT;
            END IF;
        END LOOP;
        IF refused <> '' THEN
            RETURN NEXT refused;
            CONTINUE;
        END IF;
        FOR j IN 1 .. coalesce(array_length(mine, 1), 0) LOOP
            k := array_position(wids, mine[j]);
            room[k] := room[k] - p_amounts[i];
            added[k] := added[k] + p_amounts[i];
        END LOOP;
        INSERT INTO tenants_reservation (id, request_id, tenant_id, agent_id, api_key_id,
            amount_microcents, agent_window_id, tenant_window_id, extra_windows, model, status,
            created_at, expires_at)
        VALUES (p_ids[i], p_request_ids[i], p_tenants[i], p_agents[i], p_keys[i], p_amounts[i],
            p_agent_windows[i], p_tenant_windows[i], coalesce(p_extras[i], '[]'::jsonb),
            p_models[i], 'held', p_nows[i], p_expires[i]);
        RETURN NEXT '';
    END LOOP;
    UPDATE tenants_budgetwindow w SET reserved_microcents = w.reserved_microcents + v.added
    FROM unnest(wids, added) AS v(id, added)
    WHERE w.id = v.id AND v.added <> 0;
END $$;

CREATE FUNCTION fairlane_budget_settle_many(
    p_request_ids varchar[], p_tenants bigint[], p_costs bigint[], p_backends varchar[],
    p_models varchar[], p_prompts integer[], p_completions integer[], p_cached integer[],
    p_latencies integer[], p_statuses varchar[], p_nows timestamptz[], p_traces varchar[],
    p_versions varchar[], p_timelines jsonb[])
RETURNS TABLE (outcome text, charge bigint, held bigint, prior text, usage_id bigint,
    agent_id uuid, api_key_id uuid, agent_window bigint, tenant_window bigint,
    agent_spent bigint, tenant_spent bigint, extra_windows bigint[], extra_spent bigint[])
LANGUAGE plpgsql AS $$
DECLARE
    r tenants_reservation%ROWTYPE;
    wids bigint[];  -- the batch's windows, with their figures as the batch's charges go
    w_spent bigint[];
    w_reserved bigint[];
    w_limit bigint[];
    changed boolean[];
    mine bigint[];
    k int;
BEGIN
    PERFORM 1 FROM tenants_reservation x WHERE x.request_id = ANY(p_request_ids)
        ORDER BY x.id FOR UPDATE;
    PERFORM 1 FROM tenants_budgetwindow w WHERE w.id IN (
        SELECT x.agent_window_id FROM tenants_reservation x
        WHERE x.request_id = ANY(p_request_ids))
        ORDER BY w.id FOR UPDATE;
    PERFORM 1 FROM tenants_budgetwindow w WHERE w.id IN (
        SELECT x.tenant_window_id FROM tenants_reservation x
        WHERE x.request_id = ANY(p_request_ids))
        ORDER BY w.id FOR UPDATE;
    PERFORM 1 FROM tenants_budgetwindow w WHERE w.id IN (
        SELECT e::bigint FROM tenants_reservation x, jsonb_array_elements_text(x.extra_windows) e
        WHERE x.request_id = ANY(p_request_ids))
        ORDER BY w.id FOR UPDATE;
    -- Read once, locked; written back in one UPDATE per window (see the holds above).
    SELECT coalesce(array_agg(w.id), '{}'), coalesce(array_agg(w.spent_microcents), '{}'),
           coalesce(array_agg(w.reserved_microcents), '{}'),
           coalesce(array_agg(b.limit_microcents), '{}')
    INTO wids, w_spent, w_reserved, w_limit
    FROM tenants_budgetwindow w JOIN tenants_budget b ON b.id = w.budget_id
    WHERE w.id IN (
        SELECT x.agent_window_id FROM tenants_reservation x
        WHERE x.request_id = ANY(p_request_ids)
        UNION SELECT x.tenant_window_id FROM tenants_reservation x
        WHERE x.request_id = ANY(p_request_ids)
        UNION SELECT e::bigint
        FROM tenants_reservation x, jsonb_array_elements_text(x.extra_windows) e
        WHERE x.request_id = ANY(p_request_ids));
    changed := array_fill(false, ARRAY[cardinality(wids)]);
    FOR i IN 1 .. coalesce(array_length(p_request_ids, 1), 0) LOOP
        outcome := NULL; charge := NULL; held := NULL; prior := NULL; usage_id := NULL;
        agent_id := NULL; api_key_id := NULL; agent_window := NULL; tenant_window := NULL;
        agent_spent := NULL; tenant_spent := NULL; extra_windows := NULL; extra_spent := NULL;
        SELECT * INTO r FROM tenants_reservation x
        WHERE x.tenant_id = p_tenants[i] AND x.request_id = p_request_ids[i];
        IF NOT FOUND THEN
            outcome := 'missing';
            RETURN NEXT;
            CONTINUE;
        END IF;
        prior := r.status;
        agent_id := r.agent_id; api_key_id := r.api_key_id;
        agent_window := r.agent_window_id; tenant_window := r.tenant_window_id;
        IF r.status = 'settled' THEN
            outcome := 'settled';
            SELECT u.id INTO usage_id FROM tenants_usagerecord u
            WHERE u.request_id = p_request_ids[i];
            RETURN NEXT;
            CONTINUE;
        END IF;
        mine := ARRAY[r.agent_window_id, r.tenant_window_id] || CASE
            WHEN r.extra_windows = '[]'::jsonb THEN '{}'::bigint[]
            ELSE ARRAY(SELECT e::bigint FROM jsonb_array_elements_text(r.extra_windows) e
                       ORDER BY 1) END;
        held := CASE WHEN r.status = 'held' THEN r.amount_microcents ELSE 0 END;
        charge := p_costs[i];
        FOR j IN 1 .. array_length(mine, 1) LOOP
            k := array_position(wids, mine[j]);
            IF k IS NOT NULL THEN
                charge := GREATEST(LEAST(charge,
                    w_limit[k] - w_spent[k] - (w_reserved[k] - held)), 0);
            END IF;
        END LOOP;
        FOR j IN 1 .. array_length(mine, 1) LOOP
            k := array_position(wids, mine[j]);
            CONTINUE WHEN k IS NULL;
            w_reserved[k] := w_reserved[k] - held;
            w_spent[k] := w_spent[k] + charge;
            changed[k] := true;
            IF j = 1 THEN agent_spent := w_spent[k];
            ELSIF j = 2 THEN tenant_spent := w_spent[k];
            ELSE
                extra_windows := coalesce(extra_windows, '{}') || mine[j];
                extra_spent := coalesce(extra_spent, '{}') || w_spent[k];
            END IF;
        END LOOP;
        UPDATE tenants_reservation x SET status = 'settled', closed_at = p_nows[i]
        WHERE x.id = r.id;
        INSERT INTO tenants_usagerecord AS u (request_id, tenant_id, agent_id, api_key_id,
            backend, model, prompt_tokens, completion_tokens, cached_tokens, cost_microcents,
            unbilled_microcents, latency_ms, status, created_at, trace_id, model_version,
            timeline)
        VALUES (p_request_ids[i], p_tenants[i], r.agent_id, r.api_key_id, p_backends[i],
            p_models[i], p_prompts[i], p_completions[i], p_cached[i], charge,
            p_costs[i] - charge, p_latencies[i], p_statuses[i], p_nows[i], p_traces[i],
            p_versions[i], p_timelines[i])
        RETURNING u.id INTO usage_id;
        outcome := 'ok';
        RETURN NEXT;
    END LOOP;
    UPDATE tenants_budgetwindow w
    SET spent_microcents = v.spent, reserved_microcents = v.reserved
    FROM unnest(wids, w_spent, w_reserved, changed) AS v(id, spent, reserved, changed)
    WHERE w.id = v.id AND v.changed;
END $$;
"""

DROP_NEW = """
DROP FUNCTION IF EXISTS fairlane_budget_hold_many(uuid[], varchar[], bigint[], uuid[], uuid[],
    bigint[], bigint[], bigint[], jsonb[], varchar[], timestamptz[], timestamptz[]);
DROP FUNCTION IF EXISTS fairlane_budget_settle_many(varchar[], bigint[], bigint[], varchar[],
    varchar[], integer[], integer[], integer[], integer[], varchar[], timestamptz[], varchar[],
    varchar[], jsonb[]);
DROP FUNCTION IF EXISTS fairlane_budget_hold(uuid, varchar, bigint, uuid, uuid, bigint, bigint,
    bigint, jsonb, varchar, timestamptz, timestamptz);
DROP FUNCTION IF EXISTS fairlane_budget_settle(varchar, bigint, bigint, varchar, varchar,
    integer, integer, integer, integer, varchar, timestamptz, varchar, varchar, jsonb);
"""

# The old ones: 0007's batches (over 0005's hold and 0006's settlement).
DROP_OLD = _0007.DROP + _0005.DROP.split(";")[0] + ";\n" + _0006.NEW
CREATE_OLD = (
    _0005.HOLD.replace("CREATE OR REPLACE", "CREATE")
    + _0006.SETTLE.replace("CREATE OR REPLACE", "CREATE")
    + _0007.FUNCTIONS
)


def _only_agent_and_tenant_budgets(apps, schema_editor):
    """Going back: the old schema has one budget per agent and one per tenant, for every
    model; refuse plainly while budgets of the other scopes exist (remove them first)."""
    Budget = apps.get_model("tenants", "Budget")
    others = Budget.objects.exclude(api_key=None, member=None, model_names=[]).count()
    if others:
        raise RuntimeError(
            f"{others} budget(s) per API key, member or model exist; remove them before "
            "migrating tenants below 0012"
        )


def _owner_keys(apps, schema_editor):
    Budget = apps.get_model("tenants", "Budget")
    for budget in Budget.objects.all():
        budget.owner_key = f"agent:{budget.agent_id}" if budget.agent_id else "tenant"
        budget.save(update_fields=["owner_key"])



class Migration(migrations.Migration):

    dependencies = [
        ('tenants', '0011_budget_soft_limits'),
    ]

    operations = [
        migrations.AlterModelOptions(
            name='budget',
            options={'ordering': ['tenant', 'owner_key']},
        ),
        migrations.RemoveConstraint(
            model_name='budget',
            name='budget_one_per_agent',
        ),
        migrations.RemoveConstraint(
            model_name='budget',
            name='budget_one_per_tenant',
        ),
        migrations.AddField(
            model_name='budget',
            name='api_key',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='budgets', to='tenants.apikey'),
        ),
        migrations.AddField(
            model_name='budget',
            name='member',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='budgets', to='tenants.membership'),
        ),
        migrations.AddField(
            model_name='budget',
            name='model_names',
            field=models.JSONField(blank=True, default=list),
        ),
        migrations.AddField(
            model_name='budget',
            name='owner_key',
            field=models.CharField(default='', editable=False, max_length=600),
        ),
        migrations.AddField(
            model_name='reservation',
            name='extra_windows',
            field=models.JSONField(blank=True, default=list),
        ),
        migrations.AddField(
            model_name='reservation',
            name='model',
            field=models.CharField(blank=True, default='', max_length=200),
        ),
        migrations.AddConstraint(
            model_name='budget',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('api_key__isnull', True), ('member__isnull', True)), models.Q(('agent__isnull', True), ('member__isnull', True)), models.Q(('agent__isnull', True), ('api_key__isnull', True)), _connector='OR'), name='budget_one_scope'),
        ),
        migrations.RunPython(_owner_keys, migrations.RunPython.noop, elidable=False),
        migrations.RunPython(
            _0005._run(DROP_OLD + HOLD + SETTLE + MANY),
            _0005._run(DROP_NEW + CREATE_OLD),
            elidable=False,
        ),
        migrations.AddConstraint(
            model_name='budget',
            constraint=models.UniqueConstraint(fields=('tenant', 'owner_key'), name='budget_one_per_owner'),
        ),
        # Last, so that going back checks first.
        migrations.RunPython(
            migrations.RunPython.noop, _only_agent_and_tenant_budgets, elidable=False
        ),
    ]
