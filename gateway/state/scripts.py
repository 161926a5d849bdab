"""Lua run by Redis so that one batch lands all at once, exactly once.

FLUSH_BATCH applies a whole batch (every class of one flush) in one atomic
script call, and returns the new totals of the classes it touched, so the
writer sees its own writes merged with everyone else's without a second round
trip. A marker key per batch id makes a retry of a batch whose reply was lost
(timeout after Redis applied it) a no-op instead of a double count.

KEYS[1] = class index (sorted set: class id -> last update, unix seconds)
KEYS[2] = batch marker key
KEYS[3..] = one hash per class, in the order of the payload
ARGV[1] = class key TTL (s), ARGV[2] = now (unix s), ARGV[3] = marker TTL (s),
ARGV[4] = JSON list of {"id": class_id, "c": {name: "inc"}, "m": {name: "value"}}
Hash fields: "c:<counter>" (HINCRBYFLOAT), "m:<meta>" (HSET).
Returns {applied (0|1), {HGETALL of each class key}...}.
"""

from __future__ import annotations

FLUSH_BATCH = """
local applied = 0
if redis.call('SET', KEYS[2], '1', 'NX', 'EX', tonumber(ARGV[3])) then
  applied = 1
  local ttl = tonumber(ARGV[1])
  local now = tonumber(ARGV[2])
  local payload = cjson.decode(ARGV[4])
  for i, entry in ipairs(payload) do
    local key = KEYS[i + 2]
    for name, inc in pairs(entry['c']) do
      redis.call('HINCRBYFLOAT', key, 'c:' .. name, inc)
    end
    for name, value in pairs(entry['m']) do
      redis.call('HSET', key, 'm:' .. name, value)
    end
    redis.call('EXPIRE', key, ttl)
    redis.call('ZADD', KEYS[1], now, entry['id'])
  end
  redis.call('EXPIRE', KEYS[1], ttl)
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - ttl)
end
local out = {applied}
for i = 3, #KEYS do
  out[#out + 1] = redis.call('HGETALL', KEYS[i])
end
return out
"""
