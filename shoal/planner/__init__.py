"""The planner: memory, step time, MFU and cost of parallel layouts, and the search over them.

Pure Python with no torch import (DESIGN.md); see docs/planner.md for the models and calibration.
"""
