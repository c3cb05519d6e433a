"""Prefect tasks: cached, content-addressed wrappers of the library's stage functions (DESIGN.md layout).

Every task's cache key (``tasks.cache.content_key``) is the sha256 of the content of the files it reads,
the params keys it reads, and the source of the edgeplan packages it runs (so a change in library code
misses the cache, which Prefect's TASK_SOURCE policy alone would not see), plus edgeplan's version.
"""
