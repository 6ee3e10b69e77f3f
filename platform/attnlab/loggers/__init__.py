"""The run folder and its loggers: CSV, TensorBoard and wandb (with an offline fallback)."""
