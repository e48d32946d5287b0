-- generation_of: the generation of delayed buckets, as the layout hash stores it. No keys.
-- generation_of(stored): the generation of delayed buckets as stored in the layout hash
-- (its "generation" field, or false): 0 when none is stored; garbage written by hand
-- reads as the last generation, so that lookups try every one and nothing becomes
-- unfindable.
local MOST_GENERATION = 24
local function generation_of(stored)
  local number = tonumber(stored)
  if not stored then
    return 0
  end
  if not number or number ~= math.floor(number) or number < 0 or number > MOST_GENERATION then
    return MOST_GENERATION
  end
  return number
end
