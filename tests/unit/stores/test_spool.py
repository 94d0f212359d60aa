"""tuner.stores.run_writer.Spool: writes kept while the MLflow server is away, replayed in order."""

import pytest

from tuner.stores.run_writer import Spool


def test_a_spool_replays_in_order_and_keeps_what_the_server_did_not_take(tmp_path):
    spool = Spool(tmp_path / "pending" / "run.jsonl")
    assert not spool and len(spool) == 0 and spool.replay(lambda kind, payload: None) == 0
    for n in range(3):
        spool.append("tags", {"n": n, "value": float("nan")})  # NaN metrics are kept as written
    assert spool and len(spool) == 3

    sent = []

    def away_at_second(kind, payload):
        if payload["n"] == 1:
            raise ConnectionError("Connection refused")
        sent.append(payload["n"])

    # the first write is sent; the server goes away at the second, which stays first with the one after it
    assert spool.replay(away_at_second) == 2 and sent == [0] and len(spool) == 2
    assert spool.replay(lambda kind, payload: sent.append(payload["n"])) == 0
    assert sent == [0, 1, 2] and not spool.path.exists()


def test_a_spool_raises_what_is_not_an_absent_server(tmp_path):
    spool = Spool(tmp_path / "run.jsonl")
    spool.append("tags", {"n": 0})

    def broken(kind, payload):
        raise ValueError("a bad write")

    # a write that fails for another reason is the caller's error, and nothing is dropped
    with pytest.raises(ValueError, match="a bad write"):
        spool.replay(broken)
    assert len(spool) == 1


def test_a_kept_trial_start_sent_again_from_another_process_makes_no_second_run(tmp_path):
    # The server created a trial's run and went away before the rest of that write (its params) was done: the
    # driver kept the whole start. `tuner sync`, another process, sends it again: the run is found by its key tag
    # and completed, not made twice (seen in CI: a trial counted twice after a server was killed mid-search).
    from tuner.stores import mlflow_store, run_writer
    from tuner.stores.tags import TRIAL_KEY_TAG

    store = tmp_path / "mlflow"
    uri = mlflow_store.default_tracking_uri(store)
    driver = run_writer.SearchTracker(uri, "kept", store)
    parent = driver.start("search-kept", {"trials": 2}, {})
    spec = {"trainer": "sft", "params": {"learning_rate": 1e-4}, "max_steps": 4, "seed": 0, "model": "tiny"}
    sent = driver.start_trial("key-0", 0, spec)  # the run exists there
    driver.spool.append("trial_start", {"key": "key-0", "number": 0, "spec": spec, "tags": {}})  # and was kept
    driver.spool.append("trial_start", {"key": "key-1", "number": 1, "spec": spec, "tags": {}})  # never sent

    sync = run_writer.SearchTracker(uri, None, store, parent_id=parent)  # a new process: it knows no run ids
    assert sync.flush() == 0
    runs = sync.client.search_runs([sync.experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{parent}'")
    keys = sorted(r.data.tags[TRIAL_KEY_TAG] for r in runs)
    assert keys == ["key-0", "key-1"], keys  # one run per trial
    assert next(r for r in runs if r.data.tags[TRIAL_KEY_TAG] == "key-0").info.run_id == sent
    assert all(r.data.params["learning_rate"] == "0.0001" for r in runs)


def test_a_server_that_dies_while_it_answers_is_a_server_away_not_a_failed_write(monkeypatch):
    # Seen in a CI run: the MLflow server was killed while it answered a log_batch; the cut-off answer reached the
    # search as an MlflowException around requests' ChunkedEncodingError ("Connection broken: IncompleteRead"), which
    # was not taken for an absent server, and the search crashed instead of keeping its writes on disk.
    import socket
    import threading

    from mlflow.entities import Param

    from tuner.stores import mlflow_store
    from tuner.stores.run_writer import _unavailable

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def answer_half():
        for _ in range(4):  # each request the client makes: a chunked answer cut off after its first bytes
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
                         b"10\r\n{\"a\"")
            conn.close()

    threading.Thread(target=answer_half, daemon=True).start()
    try:
        with pytest.raises(Exception) as cut_off:
            mlflow_store.client(f"http://127.0.0.1:{port}").log_batch("0" * 32, params=[Param("a", "1")])
    finally:
        listener.close()
    assert _unavailable(cut_off.value), f"{type(cut_off.value).__name__}: {cut_off.value}"
    assert not _unavailable(ValueError("param 'a' already logged with another value"))


def test_a_server_that_refuses_the_searchs_credentials_mid_search_is_kept_on_disk():
    # A server with users (MLflow's basic-auth app) whose password changed under a running search answers 401: its
    # writes are kept for tuner sync, not lost (tests/e2e/stores/test_basic_auth.py runs it for real).
    from mlflow.exceptions import MlflowException

    from tuner.stores.run_writer import _unavailable

    for code in (401, 403):
        assert _unavailable(MlflowException(f"API request to endpoint /api/2.0/mlflow/runs/log-batch failed with "
                                            f"error code {code} != 200. Response body: 'You are not authenticated.'"))
    assert not _unavailable(MlflowException("API request to endpoint /api/2.0/mlflow/runs/log-batch failed with "
                                            "error code 400 != 200. Response body: 'INVALID_PARAMETER_VALUE'"))
