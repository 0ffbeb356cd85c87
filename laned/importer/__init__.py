"""`laned import`: a published command line read without a shell, translated into a lane,
written as TOML (pure)."""
