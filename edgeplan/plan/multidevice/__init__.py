"""Multi-device (AutoDiCE): specs, units, exploration."""
