-- in_chunks(list, call): call(first, last) for each span of at most CHUNK elements of
-- the list, for variadic commands over lists of any length (unpack() spreads a list on
-- Lua's stack, which holds a few thousand values). CHUNK is even: pairs stay whole.
local CHUNK = 1000
local function in_chunks(list, call)
  for first = 1, #list, CHUNK do
    call(first, math.min(first + CHUNK - 1, #list))
  end
end

-- The values of ``fields`` in the hash at ``hash_key`` (false for a field it lacks), in
-- their order, read with one HMGET per chunk.
local function hash_values(hash_key, fields)
  local values = {}
  in_chunks(fields, function(first, last)
    local found = redis.call('HMGET', hash_key, unpack(fields, first, last))
    for n = first, last do
      values[n] = found[n - first + 1]
    end
  end)
  return values
end
