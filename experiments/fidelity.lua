-- fidelity.lua: every method on synthetic caches of two model shapes, three
-- budgets. Scores: attention-output error of probe queries (full vs
-- compressed cache) and retention of the planted outlier tokens.
--
--   kvsieve run experiments/fidelity.lua            -- results/kvsieve.db
--   kvsieve report --experiment fidelity
--   kvsieve run experiments/fidelity.lua -D 'dataset.n_tokens={1024}'   -- longer prompts (slower)
--
-- H2O, LOOK-M and MEDA score tokens with the attention of every prompt
-- position, so the dataset records the queries of all positions
-- (queries = "all"); SnapKV takes the last `window` of them.
-- criticalkv / criticaladakv are not here: they need each layer's output
-- projection W_o, which synthetic caches do not have (the engine does:
-- experiments/methods.lua); nor is kvzip: it needs the model's
-- context-reconstruction pass (the engine runs it: experiments/methods.lua).

experiment {
  name    = "fidelity",
  kind    = "fidelity",
  description = "all methods, two shapes, three budgets, synthetic caches",
  dataset = synthetic {
    shape    = { "gemma3-270m", "qwen2.5-vl-7b" },
    n_tokens = 512,
    seeds    = { 1, 2 },
    queries  = "all",
    probes   = 16,
  },
  methods = { "full", "random", "streamingllm", "h2o", "snapkv", "lookm", "meda", "flashcache",
              "knorm", "tova", "keydiff", "pyramidkv", "chunkkv", "expected_attention",
              "pyramid_tova", "adakv", "ada_pyramidkv", "ada_flashcache", "lagkv", "cur",
              "leverage", "cake", "simlayerkv", "qfilters",
              "compactor", "finch", "think" },
  budgets = { 0.1, 0.2, 0.5 },
  params  = { flashcache = { gamma = { 0.1, 0.2 } } },
  threads = 2,
}
