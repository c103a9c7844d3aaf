local step = tonumber((...)) or 1
return cube.rincr(0, 0, 0, step)
