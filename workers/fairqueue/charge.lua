-- Charge a tenant output tokens as they are generated (divided by its weight).
-- KEYS[1] prefix; ARGV: tenant lane tokens
local p, tenant, lane, tokens = KEYS[1], ARGV[1], ARGV[2], tonumber(ARGV[3])
local weight = tonumber(redis.call('HGET', p .. 'weight', tenant) or '1')
local counter = tonumber(redis.call('HGET', p .. 'vtc:' .. lane, tenant) or '0') + tokens / weight
redis.call('HSET', p .. 'vtc:' .. lane, tenant, counter)
redis.call('ZADD', p .. 'active:' .. lane, 'XX', counter, tenant)
return tostring(counter)
