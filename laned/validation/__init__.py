"""A config judged: loaded (`load`: the TOML file parsed into laned.config's models, every
problem at once) and checked by every rule that needs an engine's or the core's knowledge
(`rules`, `engine_rules`, `secret_rules`; `engine_flags`: against an engine's own parser).
Above laned.engines, so that the config model below knows no engine (pure)."""
