"""Every error a user can cause, with the exit code the command line gives it.

The entry points print such an error as one line (`error: ...`) and exit with its code;
anything else is a bug and keeps its traceback.
"""


class SpecdraftError(Exception):
    """An error the user can fix; the message says what to change."""

    exit_code = 2


class ConfigError(SpecdraftError, ValueError):
    """An impossible or incomplete configuration."""


class PairError(SpecdraftError, ValueError):
    """A target/draft pair that cannot be used together."""


class PromptError(SpecdraftError, ValueError):
    """A prompt source that cannot be used; the message names the file, line and fix."""


class ExportError(SpecdraftError, ValueError):
    """An export that cannot be written as asked."""


class TrainingDiverged(SpecdraftError, RuntimeError):
    """The loss or the gradient became NaN or infinite; the message names the last good checkpoint."""

    exit_code = 3


class ExportMismatch(SpecdraftError, RuntimeError):
    """The exported draft, read back, decodes differently from the trained one: the export was not published.

    Not a configuration problem: the trained draft is intact, and the message carries the figures to report.
    """

    exit_code = 4


class StorageError(SpecdraftError, OSError):
    """A file could not be written: its filesystem is full, read-only or not this user's to write. The message
    names the path; what was written before is kept."""
