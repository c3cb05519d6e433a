"""SwapLess (numpy and the standard library only): instances, the analytic model, the allocators."""
