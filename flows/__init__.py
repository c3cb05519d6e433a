"""Prefect flows: composition only (the stages are ``tasks``, the algorithms ``edgeplan``)."""
