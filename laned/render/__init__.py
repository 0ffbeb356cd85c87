"""What laned writes: units and serve wrappers rendered deterministically (pure), and the
atomic writer that puts them on disk."""
