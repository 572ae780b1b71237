"""Measuring: the machine (`shoal doctor`: doctor.py, envcheck.py, commbench.py; the planner's `local`
profile: local_profile.py) and layouts against one process (`shoal verify`: parity.py). The peak
FLOP/s and the matmul timer they share are shoal/hardware's."""
