"""Tests on an emulated two-node cluster (a package, so its conftest does not shadow tests/conftest.py)."""
