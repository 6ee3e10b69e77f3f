"""One error type for every mistake a user can make, so the CLI can print it without a traceback."""


class AttnlabError(Exception):
    """A problem with the user's input (config, data file, checkpoint) and how to fix it."""


class ConfigError(AttnlabError, ValueError):
    """A config value that cannot work; the message names the field and the fix."""


class DataError(AttnlabError, ValueError):
    """A data file that is missing or malformed; the message names the file (and line)."""
