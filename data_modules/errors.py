"""The error types of bad user input, shared by both packages.

They live here because data_modules is the base of the two: it imports nothing from attnlab, and
attnlab (models, training, CLI) builds on it and re-exports these from attnlab.errors, where the
CLI turns any of them into one line and exit status 2. Kept free of imports, so reading it costs
nothing.
"""


class AttnlabError(Exception):
    """A problem with the user's input (config, data file, checkpoint) and how to fix it."""


class ConfigError(AttnlabError, ValueError):
    """A config value that cannot work; the message names the field and the fix."""


class DataError(AttnlabError, ValueError):
    """A data file that is missing or malformed; the message names the file (and line)."""
