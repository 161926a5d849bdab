"""The Lua the limiter runs in Redis: one atomic call per check, one per settlement.

CHECK is `gcra.check` for the requests and the tokens bucket of one key plus the
key's in-flight set, all or nothing: a request refused by one limit consumes
nothing from the others. Time is the server's (`TIME`), so replicas with
skewed clocks agree; ARGV[1] may pin it (tests). Floats stay in Redis as
`%.3f` strings; replies are integers (Lua numbers would be truncated anyway).

KEYS[1] = requests TAT, KEYS[2] = tokens TAT, KEYS[3] = in-flight sorted set
(member -> lease expiry, ms). ARGV = now_ms ('' = TIME), period_ms, rpm, tpm,
max_concurrent (0 = no limit), token cost, member, lease_ms.
Reply: {status (0 ok, 1 requests, 2 tokens, 3 concurrency), requests remaining,
requests reset ms, tokens remaining, tokens reset ms, retry ms (-1 = never), in flight};
remaining is -1 for a dimension without a limit.

SETTLE charges (or refunds) the difference between used and reserved tokens with
`gcra.charge` and removes the request from the in-flight set.
KEYS[1] = tokens TAT, KEYS[2] = in-flight set. ARGV = now_ms ('' = TIME),
period_ms, tpm, token delta, member ('' = none).
"""

from __future__ import annotations

_PRELUDE = """
local now
if ARGV[1] ~= '' then
  now = tonumber(ARGV[1])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
end
local period = tonumber(ARGV[2])
local EPS = 1e-6
local function store(key, tat)
  if tat > now then
    redis.call('SET', key, string.format('%.3f', tat), 'PX', math.ceil(tat - now) + 1000)
  else
    redis.call('DEL', key)
  end
end
local function base_of(key)
  local tat = tonumber(redis.call('GET', key))
  if tat and tat > now then return tat end
  return now
end
"""

CHECK = (
    _PRELUDE
    + """
local function gcra(key, limit, cost)
  if limit <= 0 then return {1, -1, 0, 0, nil} end
  local interval = period / limit
  local base = base_of(key)
  local after = base + cost * interval
  if after - now <= period + EPS then
    local left = math.floor((period - (after - now)) / interval + EPS)
    return {1, math.max(0, left), after - now, 0, after}
  end
  local left = math.floor((period - (base - now)) / interval + EPS)
  local retry = after - period - now
  if cost > limit then retry = -1 end
  return {0, math.max(0, left), base - now, retry, nil}
end
local rpm, tpm, conc = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local cost = tonumber(ARGV[6])
local req = gcra(KEYS[1], rpm, 1)
local tok = gcra(KEYS[2], tpm, cost)
local in_flight = 0
if conc > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
  in_flight = redis.call('ZCARD', KEYS[3])
end
local status, retry = 0, 0
if req[1] == 0 then status, retry = 1, req[4]
elseif tok[1] == 0 then status, retry = 2, tok[4]
elseif conc > 0 and in_flight >= conc then status, retry = 3, 1000
end
if status == 0 then
  if req[5] then store(KEYS[1], req[5]) end
  if tok[5] then store(KEYS[2], tok[5]) end
  if conc > 0 then
    local lease = tonumber(ARGV[8])
    redis.call('ZADD', KEYS[3], now + lease, ARGV[7])
    redis.call('PEXPIRE', KEYS[3], math.ceil(lease))
    in_flight = in_flight + 1
  end
else
  -- Refused: report the buckets as they stand (nothing was taken from them).
  if req[1] == 1 then req = gcra(KEYS[1], rpm, 0) end
  if tok[1] == 1 then tok = gcra(KEYS[2], tpm, 0) end
end
if retry >= 0 then retry = math.ceil(retry) end
return {status, req[2], math.ceil(req[3]), tok[2], math.ceil(tok[3]), retry, in_flight}
"""
)

SETTLE = (
    _PRELUDE
    + """
local limit, delta = tonumber(ARGV[3]), tonumber(ARGV[4])
if limit > 0 and delta ~= 0 then
  local interval = period / limit
  store(KEYS[1], math.min(base_of(KEYS[1]) + delta * interval, now + period))
end
if ARGV[5] ~= '' then redis.call('ZREM', KEYS[2], ARGV[5]) end
return 1
"""
)
