"""The `laned` command line and its client of the control API."""
