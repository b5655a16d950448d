"""cluster.toml, the secrets and their rotation: read by every room and by the faces."""
