-- milebench.lua: MileBench multimodal long-context tasks, run against a
-- multimodal backend of the kvsieve HTTP API: `kvsieve-hf serve --model ...`
-- (transformers; see python/kvsieve/hf), listening at backend.url.
--
-- The data is not shipped: download MileBench and point dataset.path at a
-- task file (the JSON with "meta_data" and "data"), e.g.
--   kvsieve-hf serve --model Qwen/Qwen2.5-VL-7B-Instruct --device cuda &
--   kvsieve run experiments/milebench.lua -D 'dataset.path="/data/MileBench/ALFRED/ALFRED.json"'
-- Images are read from the task's images/ folder (MileBench's layout; else
-- the task's folder) when the task is loaded: a missing one stops the run
-- before anything is sent, and their bytes are part of every cell's key.
-- Each {image#k} placeholder becomes a <__media__> marker and the image goes
-- into the request's multimodal_data. `kvsieve serve` and the embedded
-- backend are text only: they refuse image samples (naming the sample or the
-- field), never drop the images.

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
