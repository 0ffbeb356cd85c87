"""The pure core: the lane model, the unit model, the facts of a host and a lane (`facts`), and
the decisions (policy, resume, liveness, phases, placement). No I/O, no asyncio, no clock of
its own; no engine's knowledge (laned.engines stands above it)."""
