"""Config overrides as `attnlab fit` arguments: what a sweep's runs and its tune trials are given.

Apart from spec.py so that the tune stage (which spec.py parses) can build its trials' commands
without importing the spec back.
"""
from __future__ import annotations

import json
from typing import Any


def as_cli_args(overrides: dict[str, Any]) -> list[str]:
    """`--key=value` flags (values as JSON, so null, lists and strings survive jsonargparse)."""
    return [f"--{key}={value if isinstance(value, str) else json.dumps(value)}" for key, value in overrides.items()]
