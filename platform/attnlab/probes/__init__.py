"""Probes of trained models: head ablation, attention maps and the quality of samples."""
