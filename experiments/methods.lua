-- methods.lua: every method `kvsieve methods` lists, at one budget (0.25),
-- on the quick start's needle grid, answered by the default model (Gemma 3
-- 270M) through the embedded backend. The quick start compares the paper's
-- eight; this config puts the presets built from parts (methods/parts/:
-- knorm, tova, keydiff, pyramidkv, chunkkv, expected_attention, pyramid_tova,
-- adakv, ada_pyramidkv, ada_flashcache, lagkv, criticalkv, criticaladakv, cur,
-- leverage, cake, simlayerkv, qfilters, compactor, finch, think, kvzip)
-- beside them on the same prompts (the engine gives CriticalKV each layer's W_o
-- and runs KVzip's context-reconstruction pass after the prefill).
--
--   kvsieve run experiments/methods.lua         -- prints the table
--   kvsieve report --experiment methods         -- the same table again
--
-- Gemma 3 compresses its global-attention layers only (every sixth layer);
-- the prompts (about 768 and 1536 tokens) are longer than its 512-token
-- sliding window, so only those layers can reach the needle. Head-adaptive
-- presets (ada*) keep ragged per-head counts: Gemma 3 270M has one KV head,
-- so on this model they keep what their non-adaptive twins keep; the
-- difference shows on models with several KV heads (-D model=qwen2.5-0.5b).
-- Measured on 2 CPU cores (AMD EPYC, 2026-12-08, fp16 cache, batched variants,
-- revision 1889530, fresh clone): 900 cells in 170 s (server: prefill 34%,
-- compress 46%, decode 20%). Needle at 0.25: full 0.97; tova, chunkkv,
-- pyramid_tova 0.97; pyramidkv, ada_pyramidkv 0.93; leverage 0.90; criticalkv,
-- criticaladakv 0.83; snapkv, adakv, cake, compactor 0.80; keydiff 0.73; finch
-- 0.67; think 0.63; streamingllm, simlayerkv 0.57; knorm, lagkv 0.53;
-- flashcache, ada_flashcache 0.47; h2o, lookm, meda 0.43; random,
-- expected_attention, cur, qfilters, kvzip 0.40 (n = 30 each: only the large
-- gaps are significant, see the paired table's MDE). compress_ms per request:
-- under 50 ms for most; criticalkv, qfilters, compactor 60-75 ms; kvzip 2.1 s
-- (its context-reconstruction pass, about one more prefill).
-- A composed method is a table: { score = "tova", allocate = "pyramid",
-- heads = "adakv", keep = { window = 1 } } (docs/methods.md, Composing a method).

experiment {
  name    = "methods",
  kind    = "task",
  description = "needle in a haystack: every preset at kept ratio 0.25, default model, embedded backend",
  backend = { embedded = true, model = "default" },
  dataset = niah { lengths = { 768, 1536 }, depths = { 0.1, 0.3, 0.5, 0.7, 0.9 }, per_cell = 3, seed = 7 },
  methods = { "full", "random", "streamingllm", "h2o", "snapkv", "lookm", "meda", "flashcache",
              "knorm", "tova", "keydiff", "pyramidkv", "chunkkv", "expected_attention",
              "pyramid_tova", "adakv", "ada_pyramidkv", "ada_flashcache", "lagkv",
              "criticalkv", "criticaladakv", "cur", "leverage", "cake", "simlayerkv",
              "qfilters", "compactor", "finch", "think", "kvzip" },
  budgets = { 0.25 },
  metrics = { "needle" },
  n_predict = 16,
}
