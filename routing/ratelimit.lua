-- Admit a request against the rate limits of its key, agent and tenant, all or none.
-- Fixed one-minute windows for requests and tokens; a sorted set of in-flight request ids
-- (each expiring on its own, so a crashed API process cannot leak a slot) for concurrency.
-- KEYS: per scope, its requests counter, tokens counter and in-flight set (3 keys a scope; the
-- keys of one caller share a hash tag, so the script runs on one Redis Cluster slot).
-- ARGV: now_ms request_id tokens inflight_ttl_ms, then per scope: name rpm tpm conc
-- Returns nil when admitted, else {limit_kind, scope_name}.
local now, rid = tonumber(ARGV[1]), ARGV[2]
local tokens, ttl = tonumber(ARGV[3]), tonumber(ARGV[4])
local scopes = {}
for i = 5, #ARGV, 4 do
  local k = #scopes * 3
  table.insert(scopes, {ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]),
                        tonumber(ARGV[i + 3]), KEYS[k + 1], KEYS[k + 2], KEYS[k + 3]})
end
for _, s in ipairs(scopes) do
  if s[2] > 0 and tonumber(redis.call('GET', s[5]) or '0') + 1 > s[2] then
    return {'rpm', s[1]}
  end
  if s[3] > 0 and tonumber(redis.call('GET', s[6]) or '0') + tokens > s[3] then
    return {'tpm', s[1]}
  end
  if s[4] > 0 then
    redis.call('ZREMRANGEBYSCORE', s[7], '-inf', now)
    if redis.call('ZCARD', s[7]) >= s[4] then
      return {'concurrency', s[1]}
    end
  end
end
for _, s in ipairs(scopes) do
  if s[2] > 0 then
    redis.call('INCR', s[5])
    redis.call('EXPIRE', s[5], 120)
  end
  if s[3] > 0 then
    redis.call('INCRBY', s[6], tokens)
    redis.call('EXPIRE', s[6], 120)
  end
  if s[4] > 0 then
    redis.call('ZADD', s[7], now + ttl, rid)
    redis.call('PEXPIRE', s[7], ttl)
  end
end
return nil
