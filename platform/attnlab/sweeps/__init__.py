"""Sweeps: grids of runs over seeds from one sweep file, the tune stage before them, and running them."""
