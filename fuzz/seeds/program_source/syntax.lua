local t = { 1, 2.5, "s", [[long]], x = function(a, ...) return a // 2 << 1 end }
for i = #t, 1, -1 do
  goto continue
  ::continue::
end
while false do repeat break until true end
return setmetatable(t, { __index = t })
