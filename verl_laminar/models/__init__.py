"""A model's sizes and shape from its checkpoint or config.json, without its weights (shared by the config's split
and the preflight)."""
