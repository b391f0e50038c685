"""Queue messages: frozen, small when pickled, and failures that become WorkerErrors in the parent."""

import dataclasses
import pickle

import pytest

from wdsmp.errors import ShardError, WdsmpError, WorkerError
import warnings

from wdsmp.fast.messages import BatchReady, Stop, WorkerDone, WorkerFailed, WorkerWarning


class Unpicklable(Exception):
    def __init__(self, message):
        super().__init__(message)
        self.callback = lambda: None


def failure(exn, **kw):
    try:
        raise exn
    except Exception as caught:
        return WorkerFailed.from_exception(2, caught, **kw)


@pytest.mark.parametrize("message", [
    BatchReady(slot=3, worker=1, epoch=0, index=17, count=256),
    WorkerDone(worker=1, epoch=0, batches=40, samples=10240, skipped=2, padded=1),
    WorkerWarning(worker=1, category="UserWarning", message="bad sample"),
    Stop(),
    WorkerFailed(0, "ValueError", "bad", "Traceback ...", "s.tar", "x.jpg"),
])
def test_messages_are_frozen_small_and_pickle(message):
    data = pickle.dumps(message)
    assert pickle.loads(data) == message
    if not isinstance(message, WorkerFailed):
        assert len(data) < 200
    fields = dataclasses.fields(message)
    if fields:
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(message, fields[0].name, 1)


def test_stop_is_a_value():
    assert Stop() == Stop() and hash(Stop()) == hash(Stop())


def test_failure_takes_shard_and_member_from_wdsmp_errors():
    message = failure(ShardError("cannot read", url="data-003.tar", member="000042.jpg"))
    assert (message.worker, message.exc_type, message.shard, message.member) == (
        2, "wdsmp.errors.ShardError", "data-003.tar", "000042.jpg")
    assert "cannot read" in message.message and "Traceback (most recent call last)" in message.traceback
    assert "raise exn" in message.traceback


def test_explicit_place_wins_and_builtin_types_are_short():
    message = failure(ValueError("boom"), shard="s-1.tar", member="k.cls")
    assert (message.exc_type, message.shard, message.member) == ("ValueError", "s-1.tar", "k.cls")


def test_to_error_names_worker_shard_member_and_keeps_the_traceback():
    error = failure(ShardError("cannot read", url="data-003.tar", member="000042.jpg")).to_error()
    assert isinstance(error, WorkerError) and isinstance(error, RuntimeError) and isinstance(error, WdsmpError)
    with pytest.raises(WorkerError, match=r"loader worker 2 failed, shard 'data-003.tar', member '000042.jpg': "
                                          r"wdsmp.errors.ShardError: cannot read"):
        raise error
    assert "--- traceback in worker 2 ---" in str(error) and "raise exn" in str(error)
    assert (error.worker, error.shard, error.member, error.exc_type) == (
        2, "data-003.tar", "000042.jpg", "wdsmp.errors.ShardError")
    again = pickle.loads(pickle.dumps(error))
    assert str(again) == str(error) and again.shard == "data-003.tar"


def test_to_error_without_a_place():
    error = failure(KeyError("jpg")).to_error()
    assert str(error).startswith("loader worker 2 failed: KeyError: 'jpg'\n")
    assert error.shard is None and error.member is None


def test_an_unpicklable_exception_travels_as_text():
    message = failure(Unpicklable("weird"))
    assert message.exc_type.endswith("test_messages.Unpicklable")
    assert pickle.loads(pickle.dumps(message)).to_error().args == message.to_error().args


def test_warnings_are_issued_again_with_their_category():
    message = WorkerWarning.from_warning(3, DeprecationWarning("old"), DeprecationWarning)
    with pytest.warns(DeprecationWarning, match="in loader worker 3: old"):
        message.reissue()

    class Custom(UserWarning):
        pass

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        WorkerWarning.from_warning(0, "odd", Custom).reissue()
    assert caught[0].category is UserWarning and "odd" in str(caught[0].message)
