"""The pure core: the lane model, the unit model, and the decisions (policy, resume, liveness,
phases). No I/O, no asyncio, no clock of its own."""
