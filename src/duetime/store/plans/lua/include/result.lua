-- keep_result: an attempt's result, stored at result_key with its TTL.
-- keep_result(result_key, blob, ttl): store an attempt's result, for ``ttl`` ms. The key
-- is replaced whole (DEL first), whatever it held: a result key is never read before it
-- is written, so one of the wrong type is overwritten rather than failing the step.
local function keep_result(result_key, blob, ttl)
  redis.call('DEL', result_key)
  redis.call('RPUSH', result_key, blob)
  redis.call('PEXPIRE', result_key, ttl)
end
