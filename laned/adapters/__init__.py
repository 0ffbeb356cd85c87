"""The edges to the world: systemd (D-Bus), podman, NVML, journald, engines' HTTP, processes,
files. Thin typed calls that answer values; no lane state."""
