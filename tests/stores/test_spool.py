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
