-- Lookups of one task in the delayed buckets. The caller passes the task's bucket in
-- every generation up to the current one, as KEYS[first..], each named
-- KEYS[index] .. ':' .. its name in the index; ``index`` and ``layout`` are the KEYS
-- positions of the index (ZSET bucket name -> earliest run-at) and the layout hash.
-- Scores in buckets and in the index are whole µs (see microseconds.lua).

-- The generation of delayed buckets, read from the layout hash at KEYS[layout] (needs
-- generation.lua).
local function current_generation(layout)
  return generation_of(redis.call('HGET', KEYS[layout], 'generation'))
end

-- The score of ``id`` in its bucket, or false, and the KEYS index of that bucket.
local function delayed_score(id, first)
  for key = first, #KEYS do
    local score = redis.call('ZSCORE', KEYS[key], id)
    if score then
      return score, key
    end
  end
  return false, nil
end

-- After a change to the bucket at KEYS[key]: its score in the index follows its earliest
-- task, and an empty bucket leaves the index.
local function reindex(key, index)
  local name = string.sub(KEYS[key], #KEYS[index] + 2)
  local first = redis.call('ZRANGE', KEYS[key], 0, 0, 'WITHSCORES')
  if first[2] then
    redis.call('ZADD', KEYS[index], first[2], name)
  else
    redis.call('ZREM', KEYS[index], name)
  end
end

-- Remove ``id`` from its bucket; true if it was in one.
local function remove_delayed(id, first, index, layout)
  for key = first, #KEYS do
    if redis.call('ZREM', KEYS[key], id) == 1 then
      reindex(key, index)
      redis.pcall('HINCRBY', KEYS[layout], 'tasks', -1)
      return true
    end
  end
  return false
end

-- Once no bucket is left, the layout hash goes too: an empty queue leaves no key behind,
-- and starts again from generation 0 (one bucket).
local function forget_layout_if_empty(index, layout)
  if redis.call('ZCARD', KEYS[index]) == 0 then
    redis.call('DEL', KEYS[layout])
  end
end
