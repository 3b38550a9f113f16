"""The one error type for user-facing failures: the CLI prints its message on one line."""


class TformerError(Exception):
    """A problem the user can fix (bad input, missing run, wrong option); never a bug."""
