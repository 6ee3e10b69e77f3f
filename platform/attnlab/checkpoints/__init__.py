"""Checkpoint files: reading them safely and checking they fit (reading.py), averaging them (averaging.py)."""
