"""The one error type the user sees: a problem they can fix, printed as one line, exit code 2; and any other
exception said in one line (``describe_exception``), as a trial's crash reason or inside a TunerError about the
user's code."""


class TunerError(Exception):
    """Bad input or an unusable environment, with what is wrong, where, and how to fix it.

    The CLI prints ``str(error)`` on one line and exits with code 2; a traceback is shown only
    with ``--debug``. Raise it before anything is written (MLflow run, study, files).
    """


def describe_exception(error: BaseException) -> str:
    """``"<Type>: <first line of the message> (<file>:<line> in <function>)"``: an exception as one line, with
    the place it was raised (the innermost frame), for a trial's reason and for errors about user code."""
    from pathlib import Path

    lines = str(error).strip().splitlines()
    message = lines[0][:300] if lines else ""
    text = f"{type(error).__name__}: {message}" if message else type(error).__name__
    tb = error.__traceback__
    if tb is None:
        return text
    while tb.tb_next is not None:
        tb = tb.tb_next
    code, module = tb.tb_frame.f_code, str(tb.tb_frame.f_globals.get("__name__") or "")
    path = Path(code.co_filename)
    # A file reads best from its top package ("trl/rewards/format_rewards.py", "my_rewards.py"), not in full.
    depth = 0 if module in ("", "__main__") else len(module.split(".")) + (path.name == "__init__.py")
    shown = path.relative_to(path.parents[depth - 1]) if 0 < depth <= len(path.parents) else path
    return f"{text} ({shown}:{tb.tb_lineno} in {code.co_name})"
