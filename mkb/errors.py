"""User-facing errors: each message says what is wrong and what to do next."""


class MkbError(Exception):
    """Something the user asked for cannot be done; the message carries the fix."""


class UnknownProblemError(MkbError):
    """A problem id matches no problem in the catalog."""


class ProblemFormatError(MkbError):
    """A problem file breaks the problem contract (problems/CONTRACT.md)."""


class StoreError(MkbError):
    """The results database is missing, corrupt, locked or from a newer mkb."""


class ConfigError(MkbError):
    """A setting, model spec or API key is missing or invalid."""
