"""The one error type the user sees: a problem they can fix, printed as one line, exit code 2."""


class TunerError(Exception):
    """Bad input or an unusable environment, with what is wrong, where, and how to fix it.

    The CLI prints ``str(error)`` on one line and exits with code 2; a traceback is shown only
    with ``--debug``. Raise it before anything is written (MLflow run, study, files).
    """
