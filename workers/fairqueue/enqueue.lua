-- Add a request to its tenant's queue in its lane; a tenant that was idle is lifted to the
-- floor (activate.lua, prepended).
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
activate(p, lane, tenant)
redis.call('LPUSH', p .. 'bell', 1)
redis.call('LTRIM', p .. 'bell', 0, 63)
return depth
