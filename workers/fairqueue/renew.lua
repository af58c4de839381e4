-- Extend the claims this worker holds. Returns the ids it no longer holds.
-- KEYS[1] prefix; ARGV: worker expires_ms id...
local p, worker, expires = KEYS[1], ARGV[1], tonumber(ARGV[2])
local lost = {}
for i = 3, #ARGV do
  local id = ARGV[i]
  if redis.call('HGET', p .. 'holder', id) == worker then
    redis.call('ZADD', p .. 'claims', 'XX', expires, id)
  else
    table.insert(lost, id)
  end
end
return lost
