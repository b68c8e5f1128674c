-- milebench.lua: MileBench multimodal long-context tasks, for users with
-- the data and a multimodal backend.
--
-- The data is not shipped: download MileBench and point dataset.path at a
-- task file (the JSON with "meta_data" and "data"; images are resolved
-- relative to the task's folder), e.g.
--   kvsieve run experiments/milebench.lua -D 'dataset.path="/data/MileBench/ALFRED/ALFRED.json"'
-- Samples reference images ({image#k} placeholders). The kvsieve server
-- and the OpenAI text API spoken by this runner are text only today, so a
-- task with images is refused with a message naming the sample, before any
-- backend starts; this config is ready for a multimodal backend.

experiment {
  name    = "milebench",
  kind    = "task",
  description = "MileBench task, every method at two budgets",
  backend = { url = "http://127.0.0.1:8080" },
  dataset = milebench { path = "data/milebench/task.json", limit = 100 },
  methods = { "full", "random", "streamingllm", "h2o", "snapkv", "lookm", "meda", "flashcache" },
  budgets = { 0.2, 0.5 },
  metrics = { "choice", "rouge_l" },
  n_predict = 32,
}
