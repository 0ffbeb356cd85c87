"""The owner of lane state: the supervisor and its parts (the book of records, the lane
machine's interpreter and its actions, the requests, the reactions), the seam and watchers
that do its I/O, the bus it keeps, the traffic it drains."""
