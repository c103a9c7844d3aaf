local shift = tonumber((...)) or 1000
local alive = cube.rget(0, 0, 0) ~= nil
local neighbours = cube.rcount(-1, -1, -1, 1, 1, 1) - (alive and 1 or 0)
local next_alive = neighbours == 5 or (alive and neighbours == 4)
if next_alive then
  cube.rput(0, 0, shift, "1")
elseif cube.rget(0, 0, shift) ~= nil then
  cube.rdel(0, 0, shift)
end
return next_alive
