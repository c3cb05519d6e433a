"""The discrete-event simulator that judges the analytic models."""
