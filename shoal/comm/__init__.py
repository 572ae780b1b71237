"""Collectives in one place: ops.py is the table (torch-free, the planner reads it), patch.py the
one patch/undo layer, counter.py the per-step byte counter observing it (the debug monitor is the
other observer, shoal/debug/intercept.py)."""
