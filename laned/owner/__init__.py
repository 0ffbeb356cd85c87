"""The owner of lane state: the supervisor and its parts (the book of records, the lane
machine's interpreter and its actions, the requests, the reactions), its seam to the host
(small protocols; the wiring builds them over the adapters), the start gate and the watchers,
the bus it keeps, the traffic it drains."""
