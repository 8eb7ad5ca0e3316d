"""systemd edges: sd_notify and journald's native protocol (no libsystemd)."""
