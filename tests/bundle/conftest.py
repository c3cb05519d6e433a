"""The bundle tests use ``deployment_root`` from tests/conftest.py."""
