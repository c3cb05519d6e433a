"""Bundles: the signed manifest of a deployment revision, its blobs, the ``latest`` pointer
(DESIGN.md "Store and bundles"). ``keys`` and ``manifest`` are thin (cryptography + standard library: the
device runtime verifies with them); ``build`` and ``publish`` are the pipeline's side."""
