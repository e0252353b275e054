"""The one error type of the pipeline: a problem the user can fix."""


class NmtError(ValueError):
    """A problem the user can fix; the CLI prints it as one line and exits non-zero."""
