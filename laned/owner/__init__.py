"""The owner of lane state: the supervisor and its parts (reactions, operations, the ledger),
the steps and watchers that do its I/O, the bus it keeps, the traffic it drains."""
