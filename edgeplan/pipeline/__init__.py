"""The model stages composed over an artifact directory: ingest -> analyze -> build -> verify.

Library functions with file I/O (the later Prefect tasks wrap these). Every write is atomic, and a
failure at one partition point keeps every point already produced.
"""
