"""The process a launcher starts: its environment (env.py), how it ends (exit.py, and the one table
of exit codes in exit_codes.py), its death with the launcher (process.py), and the check that a
folder is one folder for every node (shared_dir.py). No torch at import.

What a worker runs is shoal/train/__main__.py: it reads the job the launcher prepared
(<out>/job.json, shoal/launch/session.py) and never parses the command line of `shoal train`.
"""
