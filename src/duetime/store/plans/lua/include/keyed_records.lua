-- A key's record for the keyed modes (keyed_key, expiry_key, keyed_tasks_key).
-- Read and written by debounce_task, throttle_task, schedule_unique and sweep_keyed; the
-- keys: the keyed hash (field "<mode>:<key>" -> record), keyed_expiry (field -> when the
-- record means nothing more, ms) and keyed_tasks (task id -> the field whose record names
-- it). A record is text, its parts separated by '|' (no task id holds one).

local function split_record(record)
  local parts, start = {}, 1
  while true do
    local bar = string.find(record, '|', start, true)
    if not bar then
      parts[#parts + 1] = string.sub(record, start)
      return parts
    end
    parts[#parts + 1] = string.sub(record, start, bar - 1)
    start = bar + 1
  end
end

-- A record's text from its parts; numbers written whole (tostring would write a large
-- one in exponent form).
local function record_text(parts)
  local texts = {}
  for i, part in ipairs(parts) do
    texts[i] = type(part) == 'number' and string.format('%d', part) or part
  end
  return table.concat(texts, '|')
end

-- Write a key's record, and when it means nothing more (ms) unless ``expires`` is nil.
local function keep_record(keyed_key, expiry_key, field, parts, expires)
  redis.call('HSET', keyed_key, field, record_text(parts))
  if expires then
    redis.call('ZADD', expiry_key, expires, field)
  end
end

-- Forget the note that task ``id`` is carried by ``field`` (for status), if the note is
-- still that field's: the field names another task now.
local function forget_keyed_task(keyed_tasks_key, field, id)
  if id and id ~= '' and redis.call('HGET', keyed_tasks_key, id) == field then
    redis.call('HDEL', keyed_tasks_key, id)
  end
end
