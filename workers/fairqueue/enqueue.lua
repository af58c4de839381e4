-- Add a request to its tenant's queue in its lane; a tenant that was idle is lifted to the
-- lowest counter of the active tenants (or the lane's virtual time), so idling earns no credit.
-- KEYS[1] prefix; ARGV: id tenant lane weight cost payload now_ms
local p, id, tenant, lane = KEYS[1], ARGV[1], ARGV[2], ARGV[3]
local weight, cost, payload, now = ARGV[4], ARGV[5], ARGV[6], ARGV[7]
redis.call('SET', p .. 'job:' .. id, payload)
redis.call('HSET', p .. 'meta:' .. id, 'tenant', tenant, 'lane', lane, 'cost', cost, 'enq', now)
redis.call('HSET', p .. 'weight', tenant, weight)
redis.call('RPUSH', p .. 'q:' .. lane .. ':' .. tenant, id)
local depth = redis.call('HINCRBY', p .. 'depth', lane, 1)
redis.call('HSET', p .. 'meta:' .. id, 'pos', depth)  -- its place in the lane when queued
redis.call('HINCRBY', p .. 'tdepth:' .. lane, tenant, 1)
if not redis.call('ZSCORE', p .. 'active:' .. lane, tenant) then
  local counter = tonumber(redis.call('HGET', p .. 'vtc:' .. lane, tenant) or '0')
  local low = redis.call('ZRANGE', p .. 'active:' .. lane, 0, 0, 'WITHSCORES')
  local floor = tonumber(redis.call('HGET', p .. 'vtime', lane) or '0')
  if #low > 0 then floor = tonumber(low[2]) end
  if floor > counter then counter = floor end
  redis.call('HSET', p .. 'vtc:' .. lane, tenant, counter)
  redis.call('ZADD', p .. 'active:' .. lane, counter, tenant)
end
redis.call('LPUSH', p .. 'bell', 1)
redis.call('LTRIM', p .. 'bell', 0, 63)
return depth
