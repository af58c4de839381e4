-- Take the next request: first put back requests whose claim expired (their worker died),
-- then choose the lane (strict priority, except a lower lane below its minimum share of recent
-- dispatches goes first), then the backlogged tenant with the lowest virtual token counter,
-- charge it the request's input tokens divided by its weight, and claim the request.
-- KEYS[1] prefix; ARGV: worker claim_ms now_ms decay lowest_lane, the number of excluded
-- tenants and their names, then each lane from first to last and its minimum share
-- (lowest_lane 1 takes the first lane only: a worker keeps its last slots for realtime
-- requests). Excluded tenants' requests stay queued: a full worker takes beyond its slots
-- only for tenants under their share of them.
local p, worker = KEYS[1], ARGV[1]
local claim_ms, now, decay = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local lowest = tonumber(ARGV[5])
local excluded, num_excluded = {}, tonumber(ARGV[6])
for i = 7, 6 + num_excluded do
  excluded[ARGV[i]] = true
end
local lanes, min_share = {}, {}
for i = 7 + num_excluded, #ARGV, 2 do
  lanes[#lanes + 1] = ARGV[i]
  min_share[#min_share + 1] = tonumber(ARGV[i + 1])
end

-- 'leases' is the name the claims had before they were renamed: a worker of that version may
-- still hold requests there during a rolling upgrade, and they too come back when they expire.
for _, claims in ipairs({p .. 'claims', p .. 'leases'}) do
  local expired = redis.call('ZRANGEBYSCORE', claims, '-inf', now, 'LIMIT', 0, 100)
  for _, id in ipairs(expired) do
    local meta = redis.call('HMGET', p .. 'meta:' .. id, 'tenant', 'lane')
    redis.call('ZREM', claims, id)
    redis.call('HDEL', p .. 'holder', id)
    if meta[1] then
      -- Back to the head of its tenant's queue: it has waited longest.
      redis.call('LPUSH', p .. 'q:' .. meta[2] .. ':' .. meta[1], id)
      redis.call('HINCRBY', p .. 'depth', meta[2], 1)
      redis.call('HINCRBY', p .. 'tdepth:' .. meta[2], meta[1], 1)
      redis.call('HINCRBY', p .. 'requeued', 'total', 1)
      activate(p, meta[2], meta[1])
    end
  end
end

local backlog, served, total = {}, {}, 0
for i, lane in ipairs(lanes) do
  backlog[i] = i <= lowest and tonumber(redis.call('HGET', p .. 'depth', lane) or '0') > 0
  served[i] = tonumber(redis.call('HGET', p .. 'served', lane) or '0')
  total = total + served[i]
end
local chosen = nil
for i = #lanes, 2, -1 do
  -- Owed a whole dispatch: its share has fallen more than one dispatch below the minimum.
  if backlog[i] and served[i] + 1 <= min_share[i] * total then
    -- Guard only against a lane above it hogging the dispatches.
    for j = 1, i - 1 do
      if backlog[j] then chosen = i end
    end
    if chosen then break end
  end
end
if not chosen then
  for i = 1, #lanes do
    if backlog[i] then chosen = i break end
  end
end
if not chosen then return nil end
local lane = lanes[chosen]

-- The backlogged tenant with the lowest counter that is not excluded.
local function next_tenant()
  local top = redis.call('ZRANGE', p .. 'active:' .. lane, 0, num_excluded, 'WITHSCORES')
  if #top == 0 then
    redis.call('HSET', p .. 'depth', lane, 0)  -- repair a count that drifted
    return nil
  end
  for i = 1, #top, 2 do
    if not excluded[top[i]] then return top[i], tonumber(top[i + 1]) end
  end
  return nil
end

for _ = 1, 16 do
  local tenant, counter = next_tenant()
  if not tenant then return nil end
  local queue = p .. 'q:' .. lane .. ':' .. tenant
  local id = redis.call('LPOP', queue)
  if redis.call('LLEN', queue) == 0 then
    redis.call('ZREM', p .. 'active:' .. lane, tenant)
  end
  if id then
    redis.call('HINCRBY', p .. 'depth', lane, -1)
    redis.call('HINCRBY', p .. 'tdepth:' .. lane, tenant, -1)
    local cost = tonumber(redis.call('HGET', p .. 'meta:' .. id, 'cost') or '0')
    local weight = tonumber(redis.call('HGET', p .. 'weight', tenant) or '1')
    local charged = counter + cost / weight
    redis.call('HSET', p .. 'vtc:' .. lane, tenant, charged)
    redis.call('ZADD', p .. 'active:' .. lane, 'XX', charged, tenant)
    redis.call('HSET', p .. 'vtime', lane, counter)
    for i, name in ipairs(lanes) do
      local value = served[i] * decay
      if i == chosen then value = value + 1 end
      redis.call('HSET', p .. 'served', name, value)
    end
    local second = p .. 'dispatched:' .. math.floor(now / 1000)
    redis.call('INCR', second)
    redis.call('EXPIRE', second, 120)
    local enq = tonumber(redis.call('HGET', p .. 'meta:' .. id, 'enq') or now)
    local pos = redis.call('HGET', p .. 'meta:' .. id, 'pos') or '0'
    redis.call('ZADD', p .. 'claims', now + claim_ms, id)
    redis.call('HSET', p .. 'holder', id, worker)
    return {id, redis.call('GET', p .. 'job:' .. id), tenant, lane, tostring(now - enq), pos}
  end
end
return nil
