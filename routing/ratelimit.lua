-- Admit a request against the rate limits of its key, agent and tenant, all or none.
-- Fixed one-minute windows for requests and tokens; a sorted set of in-flight request ids
-- (each expiring on its own, so a crashed API process cannot leak a slot) for concurrency.
-- ARGV: now_ms window request_id tokens inflight_ttl_ms, then per scope: name rpm tpm conc
-- Returns nil when admitted, else {limit_kind, scope_name}.
local now, window, rid = tonumber(ARGV[1]), ARGV[2], ARGV[3]
local tokens, ttl = tonumber(ARGV[4]), tonumber(ARGV[5])
local scopes = {}
for i = 6, #ARGV, 4 do
  table.insert(scopes, {ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]),
                        tonumber(ARGV[i + 3])})
end
for _, s in ipairs(scopes) do
  local base = 'rl:{' .. s[1] .. '}:'
  if s[2] > 0 and tonumber(redis.call('GET', base .. 'r:' .. window) or '0') + 1 > s[2] then
    return {'rpm', s[1]}
  end
  if s[3] > 0 and tonumber(redis.call('GET', base .. 't:' .. window) or '0') + tokens > s[3] then
    return {'tpm', s[1]}
  end
  if s[4] > 0 then
    redis.call('ZREMRANGEBYSCORE', base .. 'c', '-inf', now)
    if redis.call('ZCARD', base .. 'c') >= s[4] then
      return {'concurrency', s[1]}
    end
  end
end
for _, s in ipairs(scopes) do
  local base = 'rl:{' .. s[1] .. '}:'
  if s[2] > 0 then
    redis.call('INCR', base .. 'r:' .. window)
    redis.call('EXPIRE', base .. 'r:' .. window, 120)
  end
  if s[3] > 0 then
    redis.call('INCRBY', base .. 't:' .. window, tokens)
    redis.call('EXPIRE', base .. 't:' .. window, 120)
  end
  if s[4] > 0 then
    redis.call('ZADD', base .. 'c', now + ttl, rid)
    redis.call('PEXPIRE', base .. 'c', ttl)
  end
end
return nil
