"""Test and benchmark harnesses that start real parts (an emulated cluster)."""
