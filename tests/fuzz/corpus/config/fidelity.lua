experiment {
  name = "f", kind = "fidelity",
  dataset = synthetic { shape = "tiny", n_tokens = { 64, 128 }, seeds = { 1, 2 } },
  methods = { "h2o", "flashcache" }, budgets = { 0.25, 0.5 },
  params = { flashcache = { gamma = { 0.1, 0.2 } } },
}
