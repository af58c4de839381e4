-- The one rule that lifts a tenant to the floor (prepended to enqueue.lua and dequeue.lua): a
-- tenant that comes back from idle is lifted to the lowest counter of the active tenants (or
-- the lane's virtual time), so idling earns no credit.
local function activate(p, lane, tenant)
  if not redis.call('ZSCORE', p .. 'active:' .. lane, tenant) then
    local counter = tonumber(redis.call('HGET', p .. 'vtc:' .. lane, tenant) or '0')
    local low = redis.call('ZRANGE', p .. 'active:' .. lane, 0, 0, 'WITHSCORES')
    local floor = tonumber(redis.call('HGET', p .. 'vtime', lane) or '0')
    if #low > 0 then floor = tonumber(low[2]) end
    if floor > counter then counter = floor end
    redis.call('HSET', p .. 'vtc:' .. lane, tenant, counter)
    redis.call('ZADD', p .. 'active:' .. lane, counter, tenant)
  end
end
