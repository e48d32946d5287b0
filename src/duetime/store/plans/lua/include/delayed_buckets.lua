-- One task's lookups in the delayed buckets: index_key, layout_key, its buckets in KEYS.
-- The caller passes the task's bucket in every generation up to the current one, as
-- KEYS[first..], each named index_key .. ':' .. its name in the index; ``index_key`` and
-- ``layout_key`` are the index (ZSET bucket name -> earliest run-at) and the layout hash.
-- Scores in buckets and in the index are whole µs (see microseconds.lua).
-- @include generation

-- The generation of delayed buckets, read from the layout hash at ``layout_key``.
local function current_generation(layout_key)
  return generation_of(redis.call('HGET', layout_key, 'generation'))
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

-- After a change to the bucket at ``bucket_key``: its score in the index follows its
-- earliest task, and an empty bucket leaves the index.
local function reindex(bucket_key, index_key)
  local name = string.sub(bucket_key, #index_key + 2)
  local first = redis.call('ZRANGE', bucket_key, 0, 0, 'WITHSCORES')
  if first[2] then
    redis.call('ZADD', index_key, first[2], name)
  else
    redis.call('ZREM', index_key, name)
  end
end

-- Remove ``id`` from its bucket; true if it was in one.
local function remove_delayed(id, first, index_key, layout_key)
  for key = first, #KEYS do
    if redis.call('ZREM', KEYS[key], id) == 1 then
      reindex(KEYS[key], index_key)
      redis.pcall('HINCRBY', layout_key, 'tasks', -1)
      return true
    end
  end
  return false
end

-- Once no bucket is left, the layout hash goes too: an empty queue leaves no key behind,
-- and starts again from generation 0 (one bucket).
local function forget_layout_if_empty(index_key, layout_key)
  if redis.call('ZCARD', index_key) == 0 then
    redis.call('DEL', layout_key)
  end
end
