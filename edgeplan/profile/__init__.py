"""Device profiles: CPU measured, Edge TPU emulated (or measured on a device), the rest predicted."""
