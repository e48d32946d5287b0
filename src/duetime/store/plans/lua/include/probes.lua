-- The wrong-type probes: each key given (``...``) read as the type it must hold.
-- A script that fails half way keeps the writes it made, so a script reads every key it
-- may write before its first write (or makes that write the first), and a key of the
-- wrong type (written by hand or by another program) fails the call with nothing written:
-- Redis answers WRONGTYPE, and the client names the key (store/redis/damage.py). Each
-- probe reads its keys as the type they must hold and changes nothing; a missing key
-- passes.

-- Read each key given as a hash (HGET of the field '').
local function probe_hashes(...)
  for n = 1, select('#', ...) do
    redis.call('HGET', (select(n, ...)), '')
  end
end

-- Read each key given as a sorted set (ZSCORE of the member '').
local function probe_zsets(...)
  for n = 1, select('#', ...) do
    redis.call('ZSCORE', (select(n, ...)), '')
  end
end

-- Read each key given as a list (LLEN).
local function probe_lists(...)
  for n = 1, select('#', ...) do
    redis.call('LLEN', (select(n, ...)))
  end
end
