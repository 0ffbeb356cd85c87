"""Preflight and fit: will this lane start, can this host run it? Pure judging of facts that
`laned.adapters.host` gathers."""
