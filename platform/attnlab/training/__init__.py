"""Callbacks every run carries: the non-finite-loss guard, resume, per-example records, run summaries."""
