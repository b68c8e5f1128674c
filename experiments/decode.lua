-- decode.lua: the decode-speed study. How much faster does decoding get when the KV cache is
-- compressed? Decode tokens/s against the kept ratio (1 = `full`, 0.8 ... 0.05) and the prompt
-- length (2K ... 32K tokens) on Qwen2.5-0.5B (every layer global: the whole cache is compressed)
-- and Gemma 3 270M (5 of 6 layers are sliding-window layers that keep their 512-token window:
-- only the global layers shrink, so the gain is smaller), each answer exactly n_predict tokens
-- (ignore_eos), each variant decoded alone (variants_per_request = 1: a batched decode would
-- time all variants together) and one request at a time (in_flight = 1: a server that batches
-- concurrent requests would time them together too).
--
--   kvsieve run experiments/decode.lua                                  -- both models: hours
--   kvsieve run experiments/decode.lua --experiment decode-qwen2.5-0.5b  -- one model, 3 cache types
--   kvsieve report --experiment decode-qwen2.5-0.5b                     -- the table again
--   kvsieve report --plot d.svg   -- and speed-up vs kept ratio per length: d-decode-qwen2.5-0.5b.svg, ...
--
-- A slice that runs in a few minutes on 2 CPU cores with the default model (one 2K-token prompt,
-- full and two ratios):
--   kvsieve run experiments/decode.lua --experiment decode-gemma3-270m \
--     -D 'dataset.lengths={2048}' -D dataset.per_cell=1 -D 'budgets={0.4,0.1}'
--
-- The table (eval/report_decode.c) prints, per length and ratio, decode tokens/s (tokens / decode
-- time), the measured speed-up against `full` on the same prompt, and the speed-up predicted if a
-- decode step costs the bytes it must read: (W + KV_full) / (W + KV_kept), W the weights a step reads
-- (the server's step_bytes: every tensor, the output matrix included, less an untied token-embedding
-- table, of which a step reads one row; before that field, the file's size), KV the kept cache
-- bytes the server reports (cells.model_bytes, results.kv_bytes_after). The kept cache does not
-- depend on which method chose the tokens, so one method (FlashCache, the paper's) is enough.
-- Cache types: each model's study runs once per KV cache type (f16, q8_0, q4_0: `kvsieve serve
-- --cache-type`), one table per type; a quantised type's speed-up is against the f16 `full` on
-- the same prompt, and its prediction counts its own bytes (Q8_0 34, Q4_0 18 bytes per 32
-- values against f16's 64), so the table says whether fewer bytes per row are fewer seconds.
--
-- Lengths are niah's (estimated tokens, 4 characters each): both models' tokenizers make about
-- 0.86 real tokens of one (2048 -> 1762 on Qwen2.5, 1754 on Gemma 3), and the table shows the real
-- count, classed to the nearest power of two. 30000 (about 26K real) is the "32K" point that leaves
-- room for the template and n_predict in the models' 32768-token context even if lengths were
-- counted exactly.

local CACHE_TYPES = { "f16", "q8_0", "q4_0" } -- KIVI: add "kivi4", "kivi2" once the engine has them

local function study(model, ct)
  return experiment {
    name      = "decode-" .. model,
    kind      = "task",
    description = "decode tokens/s vs kept ratio and prompt length, " .. model .. ", KV cache " .. ct,
    backend   = { embedded = true, model = model, ctx = 32768, in_flight = 1, cache = { type = ct } },
    dataset   = niah { lengths = { 2048, 4096, 8192, 16384, 30000 }, depths = { 0.5 }, per_cell = 3,
                       seed = 5 },
    methods   = { "full", "flashcache" },
    budgets   = { 0.8, 0.6, 0.4, 0.2, 0.1, 0.05 },
    metrics   = { "needle" },
    n_predict = 64,
    ignore_eos = true,
    variants_per_request = 1,
  }
end

for _, model in ipairs({ "qwen2.5-0.5b", "gemma3-270m" }) do
  for _, ct in ipairs(CACHE_TYPES) do study(model, ct) end
end
