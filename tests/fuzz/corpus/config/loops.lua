local b = {}
for i = 1, 3 do b[#b + 1] = i / 10 end
experiment { name = "l" .. #b, kind = "overhead", dataset = synthetic { shape = "tiny", n_tokens = 32 }, methods = { "random" }, budgets = b }
