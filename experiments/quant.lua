-- quant.lua: eviction against quantisation, and both together. Full, SnapKV, FlashCache and
-- AdaKV at kept ratios 0.25 and 0.5, each with every KV cache type of the engine (f16, q8_0,
-- q4_0: GGUF's blocks of 32 values and an f16 scale, `kvsieve serve -ctk/-ctv`; kivi4, kivi2), on the
-- quick-start needle grid and on a RULER slice, answered by Qwen2.5-0.5B (every layer global,
-- so a kept ratio r keeps r of the whole cache and the bytes line up: f16 at 0.25 is 25% of the
-- full f16 cache, q4_0 without eviction 18/64 = 28%, q8_0 34/64 = 53% against f16 at 0.5).
--
-- The eviction plan is applied first, then the kept rows are stored in the cache type (the
-- engine scores on the cache it holds, dequantised a tile at a time); the kv_kept_mb column is
-- the server's measured bytes after both. Each cache type is one definition of the same
-- experiment (an embedded `kvsieve serve --cache-type T` each): the rows of every type stand in
-- one table ("snapkv @q4_0"; f16 rows carry no tag), Δ against the f16 full cache, and the
-- report's "equal memory" table puts each quantised full cache beside the evicted f16 rows of
-- nearly its bytes (within 25%).
--
--   kvsieve run experiments/quant.lua --experiment quant-quickstart   -- 20 prompts x 5 types
--   kvsieve run experiments/quant.lua --experiment quant-ruler        -- the RULER slice
--   kvsieve report --experiment quant-quickstart
--
-- The quick-start grid's lengths and depths with two samples per point (the quick start has
-- three): 20 prompts, 7 variants each, per cache type. docs/performance.md shows a run.
--
-- kivi4 / kivi2: KIVI's asymmetric 4- and 2-bit cache (keys per channel, values per token, in
-- groups of 32, the last 128 tokens in full precision; docs/methods.md "KIVI quantization").

local CACHE_TYPES = { "f16", "q8_0", "q4_0", "kivi4", "kivi2" }

local METHODS = { "full", "snapkv", "flashcache", "adakv" }
local BUDGETS = { 0.25, 0.5 }
local MODEL = "qwen2.5-0.5b"

for _, ct in ipairs(CACHE_TYPES) do
  experiment {
    name    = "quant-quickstart",
    kind    = "task",
    description = "needle grid: full / snapkv / flashcache / adakv x {0.25, 0.5} x KV cache " .. ct,
    backend = { embedded = true, model = MODEL, cache = { type = ct } },
    dataset = niah { lengths = { 768, 1536 }, depths = { 0.1, 0.3, 0.5, 0.7, 0.9 }, per_cell = 2, seed = 7 },
    methods = METHODS,
    budgets = BUDGETS,
    metrics = { "needle" },
    n_predict = 16,
  }
end

for _, ct in ipairs(CACHE_TYPES) do
  experiment {
    name    = "quant-ruler",
    kind    = "task",
    description = "RULER-4K slice (4 tasks x 10): full / snapkv / flashcache / adakv x {0.25, 0.5} x KV cache " .. ct,
    backend = { embedded = true, model = MODEL, cache = { type = ct } },
    dataset = ruler { lengths = { 4096 }, n = 10, seed = 42,
                      tasks = { "niah_single_1", "niah_multikey_1", "vt", "qa_1" } },
    methods = METHODS,
    budgets = BUDGETS,
    metrics = { "ruler" },
  }
end
