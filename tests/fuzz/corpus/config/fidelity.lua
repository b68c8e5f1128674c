experiment {
  name = "f", kind = "fidelity",
  dataset = synthetic { preset = "tiny", n_tokens = { 64, 128 }, seeds = { 1, 2 } },
  methods = { "h2o", { "snapkv", window = 8 } }, budgets = { 0.25, 0.5 },
}
