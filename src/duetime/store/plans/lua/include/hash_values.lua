-- hash_values: the values of many fields of the hash at hash_key, in their order.
-- hash_values(hash_key, fields): the values of ``fields`` in the hash at ``hash_key``
-- (false for a field it lacks), in their order, read with one HMGET per chunk of the
-- fields.
-- @include chunks
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
