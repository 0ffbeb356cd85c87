"""The config: the model, its loading and every rule over it (pure)."""
