"""``edgeplan verify``: the checks of DESIGN.md at every partition point of an artifact directory."""
