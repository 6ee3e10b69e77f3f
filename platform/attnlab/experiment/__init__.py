"""Running many experiments and reading them back: sweeps, reports, plots, head ablation."""
