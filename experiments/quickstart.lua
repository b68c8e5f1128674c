-- quickstart.lua: the main job. Every method at two budgets on a small
-- needle-in-a-haystack grid, answered by the default model (Gemma 3 270M)
-- through the embedded backend (`kvsieve serve` started and stopped by the
-- runner). One request per sample: one prefill, then each (method, budget)
-- compresses a copy of the cache and decodes its answer.
--
--   kvsieve run experiments/quickstart.lua      -- prints the head-to-head table
--   kvsieve report --experiment quickstart      -- the same table again (md, --format csv|latex|json)
--
-- Resume: run the same command again; finished cells are skipped.
-- Grid (chosen so that `full` finds the needle and `random` at 0.2 mostly
-- does not, and the whole run fits in 10 minutes on 2 CPU cores): prompts
-- of about 768 and 1536 tokens (longer than Gemma 3's 512-token sliding
-- window, so only the global layers, the ones compressed, can reach the
-- needle), five depths, three samples each: 30 samples, 450 cells.
-- Measured on 2 idle CPU cores (2026-12-01, fp16 cache, batched variants):
-- 120 s for the 450 cells (model start included); full 0.97 [0.90, 1.00],
-- random 0.40 [0.23, 0.57] at budget 0.2; at budget 0.5 SnapKV (0.97) is
-- significantly better than FlashCache (0.70), StreamingLLM (0.67) and the
-- attention-score methods (Holm-adjusted McNemar p < 0.05), which is what
-- this grid is for: differences its own paired statistics can see.

experiment {
  name    = "quickstart",
  kind    = "task",
  description = "needle in a haystack: 8 methods x 2 budgets, default model, embedded backend",
  backend = { embedded = true, model = "default" },
  dataset = niah { lengths = { 768, 1536 }, depths = { 0.1, 0.3, 0.5, 0.7, 0.9 }, per_cell = 3, seed = 7 },
  methods = { "full", "random", "streamingllm", "h2o", "snapkv", "lookm", "meda", "flashcache" },
  budgets = { 0.2, 0.5 },
  metrics = { "needle" },
  n_predict = 16,
}
