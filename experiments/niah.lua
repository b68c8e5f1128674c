-- niah.lua: the larger needle-in-a-haystack study. Every method at three
-- budgets over prompts of about 1k, 2k and 4k tokens and eleven depths, on
-- the default model through the embedded backend (or point backend.url at
-- servers of your own: a list of URLs spreads the samples over them).
--
--   kvsieve run experiments/niah.lua                       -- hours on 2 CPU cores
--   kvsieve run experiments/niah.lua -D 'dataset.lengths={1024}'   -- a slice
--   kvsieve report --experiment niah --format csv > niah.csv
--
-- Cells are keyed by model hash, dataset version and content hash, sample,
-- prompt template hash, mode and (method, params, budget): stop at any time
-- and run again to resume.
-- mode = { "query_aware", "query_agnostic" } adds the kvpress-style setting
-- (context compressed, question appended after); it needs a backend that
-- decodes kv_compression.variants[].suffix after compressing.

local depths = {}
for i = 0, 10 do depths[#depths + 1] = i / 10 end

experiment {
  name    = "niah",
  kind    = "task",
  description = "needle in a haystack: 8 methods x 3 budgets, 1k-4k tokens, 11 depths",
  backend = { embedded = true, model = "default" },
  -- backend = { url = { "http://gpu-a:8080", "http://gpu-b:8080" }, in_flight = 2 },
  dataset = niah { lengths = { 1024, 2048, 4096 }, depths = depths, per_cell = 3, seed = 11 },
  methods = { "full", "random", "streamingllm", "h2o", "snapkv", "lookm", "meda", "flashcache" },
  budgets = { 0.1, 0.2, 0.5 },
  params  = { flashcache = { gamma = { 0.1, 0.2 } } },
  metrics = { "needle", "contains" },
  mode    = "query_aware",
  n_predict = 16,
}
