"""The one error type the user sees: a problem they can fix, printed as one line, exit code 2."""


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


def quiet_libraries() -> None:
    """Keep library chatter off stderr, where a bad input's one line goes, and out of a search of hundreds of
    trials: progress bars, load reports, and the datasets loader's own log of a file it cannot parse."""
    import logging

    import datasets
    import transformers

    datasets.disable_progress_bars()
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    logging.getLogger("datasets").setLevel(logging.CRITICAL)


def validated(model, raw, where: str, not_a_mapping: str, describe):
    """``model.model_validate(raw)`` for a YAML mapping the user wrote (a search space, a trial config): a value
    that is not a mapping, or does not validate, is one TunerError line naming ``where`` and, via ``describe``,
    the key and how to fix it."""
    from pydantic import ValidationError

    if not isinstance(raw, dict):
        raise TunerError(f"{where}: {not_a_mapping}")
    try:
        return model.model_validate(raw)
    except ValidationError as error:
        raise TunerError(f"{where}: {describe(error)}") from None
