-- Leases on a scarce backend: at most `slots` holders, each until its expiry; up to `depth`
-- waiters in arrival order (all wait the same time, so expiry order is arrival order).
-- KEYS[1] holders zset (member holder, score expiry ms), KEYS[2] waiters zset (same)
-- ARGV: op, holder, now_ms, ttl_ms, slots, depth, wait_ms
-- acquire -> 1 granted, 0 waiting (or still waiting), -1 queue full; renew -> 1 held, 0 not;
-- release -> 1
local holders, waiters = KEYS[1], KEYS[2]
local op, holder = ARGV[1], ARGV[2]
local now, ttl = tonumber(ARGV[3]), tonumber(ARGV[4])
redis.call('ZREMRANGEBYSCORE', holders, '-inf', now)
redis.call('ZREMRANGEBYSCORE', waiters, '-inf', now)
if op == 'release' then
  redis.call('ZREM', holders, holder)
  redis.call('ZREM', waiters, holder)
  return 1
end
if op == 'renew' then
  if redis.call('ZSCORE', holders, holder) then
    redis.call('ZADD', holders, now + ttl, holder)
    redis.call('PEXPIRE', holders, ttl * 2 + 1000)
    return 1
  end
  return 0
end
local slots, depth, wait = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
if redis.call('ZSCORE', holders, holder) then
  redis.call('ZADD', holders, now + ttl, holder)
  return 1
end
local free = slots - redis.call('ZCARD', holders)
if free > 0 then
  local rank = redis.call('ZRANK', waiters, holder)
  if (rank and rank < free) or ((not rank) and redis.call('ZCARD', waiters) < free) then
    redis.call('ZREM', waiters, holder)
    redis.call('ZADD', holders, now + ttl, holder)
    redis.call('PEXPIRE', holders, ttl * 2 + 1000)
    return 1
  end
end
if redis.call('ZSCORE', waiters, holder) then
  return 0
end
if redis.call('ZCARD', waiters) >= depth then
  return -1
end
redis.call('ZADD', waiters, now + wait, holder)
redis.call('PEXPIRE', waiters, wait * 2 + 1000)
return 0
