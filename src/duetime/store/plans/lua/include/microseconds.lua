-- Run-ats as whole µs, as the delayed buckets keep them. No keys.
-- The delayed buckets and their index keep run-ats as whole microseconds: the server keeps
-- an integer score compactly and compares it without parsing text, where a score in ms
-- with a fraction is kept as text (and parsed at every comparison). A run-at past
-- MOST_US (the year 2255: a double holds no more whole µs) goes to `scheduled`, in ms.
local MOST_US = 2 ^ 53
-- Whole µs (a number or its text) as the exact text of ms, e.g. "1795631019642.908".
local function ms_text(us)
  us = tonumber(us)
  local whole = math.floor(us / 1000)
  return string.format('%d.%03d', whole, us - whole * 1000)
end
