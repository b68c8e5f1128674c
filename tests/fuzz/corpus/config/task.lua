experiment {
  name = "q", kind = "task",
  backend = { embedded = true, model = "default" },
  dataset = niah { lengths = { 256 }, depths = { 0.5 }, per_cell = 1, seed = 7 },
  methods = { "full", "snapkv" }, budgets = { 0.5 }, metrics = { "needle" }, n_predict = 8,
}
