"""The config: the model, its names, paths and value types, and the rules that need no engine
(groups, sleep, ranks). Loading and the rules that ask each engine are laned.validation (pure)."""
