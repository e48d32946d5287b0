-- in_chunks: variadic commands over lists of any length, a span at a time. No keys.
-- in_chunks(list, call): call(first, last) for each span of at most CHUNK elements of
-- the list, for variadic commands over lists of any length (unpack() spreads a list on
-- Lua's stack, which holds a few thousand values). CHUNK is even: pairs stay whole.
local CHUNK = 1000
local function in_chunks(list, call)
  for first = 1, #list, CHUNK do
    call(first, math.min(first + CHUNK - 1, #list))
  end
end
