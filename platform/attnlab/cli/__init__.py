"""The command line: `attnlab <verb>` (main.py), the Lightning verbs (lightning_cli.py)."""
from attnlab.cli.main import main

__all__ = ["main"]
