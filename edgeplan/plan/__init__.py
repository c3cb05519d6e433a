"""Planners: SwapLess (analytic model, allocators) and the discrete-event simulator."""
