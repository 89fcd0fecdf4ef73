"""Errors a user can fix: the CLI prints them as one clear message, without a traceback."""


class UserError(Exception):
    """Bad input, a refused overwrite, a mismatched file: say what, where, and what to do."""


class ConfigError(UserError, ValueError):
    """A setting has the wrong type or value, or is unknown: a usage error (exit 2)."""
