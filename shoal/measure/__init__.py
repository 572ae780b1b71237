"""Measuring the machine: `shoal doctor` (doctor.py, envcheck.py, commbench.py), the planner's
`local` profile (local_profile.py), and the peak FLOP/s MFU is against (peak.py); one matmul timer
for all of them (matmul.py)."""
