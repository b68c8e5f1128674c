experiment { name = "r", kind = "task", backend = { url = "http://127.0.0.1:1" },
  dataset = ruler { tasks = { "niah_single_1" }, lengths = { 1024 }, n = 2 }, methods = { "full" }, budgets = { 1.0 }, metrics = { "ruler" } }
experiment { name = "j", kind = "task", backend = { url = "http://127.0.0.1:1" },
  dataset = jsonl { path = "qa.jsonl" }, methods = { "full" }, budgets = { 1.0 }, metrics = { "contains" } }
