"""inspect_all(): models found as they are called (`discovery`), and what a model is
(`model_rules`)."""
