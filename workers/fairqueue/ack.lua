-- A request finished: drop its claim and payload, if this worker still holds it (1), else 0.
-- Either way its slot on the worker is free: ring the worker's own bell (one ring kept), so
-- that a puller waiting for a slot takes the next request now, not at its next look.
-- KEYS[1] prefix; ARGV: id worker
local p, id, worker = KEYS[1], ARGV[1], ARGV[2]
redis.call('LPUSH', p .. 'freed:' .. worker, 1)
redis.call('LTRIM', p .. 'freed:' .. worker, 0, 0)
redis.call('PEXPIRE', p .. 'freed:' .. worker, 60000)
if redis.call('HGET', p .. 'holder', id) ~= worker then
  return 0  -- the claim expired and the request went to another worker, which owns it now
end
redis.call('ZREM', p .. 'claims', id)
redis.call('HDEL', p .. 'holder', id)
redis.call('DEL', p .. 'job:' .. id, p .. 'meta:' .. id)
return 1
