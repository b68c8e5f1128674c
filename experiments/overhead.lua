-- overhead.lua: the paper's latency table -- compression overhead vs prompt
-- length N for every preset `kvsieve methods` lists (performance.md
-- section 1; presets() and method_needs() read them at run time, so presets
-- added later join with the limits of their cost class). Each cell times the
-- whole compression step (kvs_compress + kvs_apply: scoring, budget
-- allocation, selection, compaction, merging, all layers): 2 warm-up runs,
-- then 20 timed runs rotated over 3 synthetic input sets (seeds 1, 2, 3);
-- median / p10 / p90, bytes moved and GB/s against a memcpy bandwidth
-- measured in the same run, GFLOP/s of attention passes, and on CPU the
-- method's dominant term timed by a micro-benchmark in the same cell (the
-- CPU bar: median <= 2 x that): the DCT pair, the attention pass, for
-- presets whose scorer reads only K and V (knorm, keydiff, lagkv, cur) the
-- L2 norm of every key + the V read and the gather, or, for full / random /
-- StreamingLLM, one read of the cache (their NaN/Inf check) + the gather of
-- the kept rows.
--
--   kvsieve run experiments/overhead.lua              -- the CPU grid below: 106 cells, about
--                                                        12 min on 2 idle cores
--   kvsieve report --experiment overhead              -- method x N tables, median [p10, p90]
--   kvsieve report --experiment overhead --plot overhead.svg   -- log-log plot
--
-- The full grid of the spec (N up to 64K, every method, all three shapes):
--   kvsieve run experiments/overhead.lua -D 'max_tokens={}'                -- GPU: add -D device=cuda
-- Extending one method's limits (an override replaces that method's whole
-- table; a shape it leaves out has no limit), e.g. H2O to 8K at Gemma only:
--   kvsieve run experiments/overhead.lua \
--     -D 'max_tokens.h2o={["gemma3-270m"]=8192,["qwen2.5-vl-7b"]=0,["llava-1.5-7b"]=0}'
-- One dtype or one thread count only:  -D dtype=f16   --threads 1
-- Some presets only (the limits below stay; those of presets not run are unused):
--   kvsieve run experiments/overhead.lua -D 'methods={"knorm","cake"}'
--
-- Where and why the default CPU grid stops lower (2 shared cores, 23 GB):
--   * Methods that read every query (H2O, LOOK-M, MEDA, Expected Attention:
--     method_needs(m) has "q_all") recompute causal attention over all N queries:
--     2 d Hq L N^2 / 2 FLOPs = 1.2 TFLOP per run at the Gemma shape and 8K,
--     6.5 s on 2 idle cores (about 1.6 s at 4K), so 2 warm-ups + 20 repetitions +
--     10 dominant-term runs x 3 methods x 2 dtypes would take 20 minutes at
--     8K and 5 at 4K: they run at 2K on the Gemma shape only (0.43-0.58 s per
--     run); the Qwen shape costs 5.4x Gemma per token pair, so none there.
--   * The other methods are linear (or N log N) in the cache: up to 32K on
--     the Gemma shape (1.2 GB per fp32 input set), 16K on the Qwen shape
--     (1.9 GB per set; 3 sets + outputs ~10 GB), 2K on LLaVA-1.5-7B (32 KV
--     heads: 2.1 GB per fp32 set at 2K; 4K would need ~13 GB of input sets).
--     Beyond that a cell needs more memory than this machine has (the runner
--     stops it with a memory error naming the sizes) or minutes per cell.

local attention = { ["gemma3-270m"] = 2048, ["qwen2.5-vl-7b"] = 0, ["llava-1.5-7b"] = 0 }
local linear    = { ["gemma3-270m"] = 32768, ["qwen2.5-vl-7b"] = 16384, ["llava-1.5-7b"] = 2048 }
-- W_o readers (criticalkv, criticaladakv) add a synthetic [Hq][Hq d][d]
-- projection (51 MB at the Qwen shape) and ||W_o v|| per token: linear, but
-- Hq d^2 E flops per token, so the 7B shapes stop at 4K.
local wo        = { ["gemma3-270m"] = 32768, ["qwen2.5-vl-7b"] = 4096, ["llava-1.5-7b"] = 2048 }

-- KVzip (method_needs has "recon") is not here: its statistic is a forward pass of the model over the
-- prompt, which a synthetic cache does not have; its cost is the engine's (docs/methods.md, "kvzip").
local methods, max_tokens = {}, {}
for _, m in ipairs(presets()) do
  local class = linear
  for _, need in ipairs(method_needs(m)) do
    if need == "q_all" then class = attention elseif need == "w_o" and class == linear then class = wo
    elseif need == "recon" then class = nil end
  end
  if class then methods[#methods + 1] = m; max_tokens[m] = class end
end

experiment {
  name    = "overhead",
  kind    = "overhead",
  description = "compression latency vs N, every method, synthetic caches, CPU",
  dataset = synthetic {
    shape    = { "gemma3-270m", "qwen2.5-vl-7b", "llava-1.5-7b" },
    n_tokens = { 2048, 4096, 8192, 16384, 32768, 65536 },
    seeds    = { 1, 2, 3 },          -- the input sets rotated over the repetitions
  },
  methods = methods,
  budgets = 0.2,
  device  = "cpu",
  dtype   = { "f32", "f16" },
  threads = 2,
  repeats = 20,
  warmup  = 2,
  max_tokens = max_tokens,
}
