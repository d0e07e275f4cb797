"""hvd_flexcomm.waiting: polling with sleeps that double up to a cap, the opt-out, stand-ins.

The real path (Horovod's poll and synchronize under horovodrun) runs in every multi-process test,
since every collective of the compressed paths waits through it; here the loop's own rules.
"""

from __future__ import annotations

import pytest

from hvd_flexcomm import waiting


class Handles:
    """An ``hvd`` whose handle finishes after ``polls_needed`` polls; records the sleeps."""

    def __init__(self, polls_needed: int) -> None:
        self.polls_needed, self.polls, self.synced = polls_needed, 0, []

    def poll(self, handle):
        self.polls += 1
        return self.polls > self.polls_needed

    def synchronize(self, handle):
        self.synced.append(handle)
        return f"output of {handle}"


def test_wait_sleeps_between_polls_doubling_up_to_the_cap(monkeypatch):
    monkeypatch.delenv(waiting.WAIT_ENV, raising=False)
    sleeps = []
    monkeypatch.setattr(waiting.time, "sleep", sleeps.append)
    hvd = Handles(polls_needed=9)
    assert waiting.synchronize(hvd, 7) == "output of 7"
    assert hvd.polls == 10 and hvd.synced == [7]
    assert sleeps[0] == waiting.FIRST_SLEEP_S and len(sleeps) == 9
    assert all(b == min(waiting.MAX_SLEEP_S, 2 * a) for a, b in zip(sleeps, sleeps[1:]))
    assert max(sleeps) == waiting.MAX_SLEEP_S


def test_a_finished_handle_is_not_slept_on(monkeypatch):
    monkeypatch.delenv(waiting.WAIT_ENV, raising=False)
    monkeypatch.setattr(waiting.time, "sleep", lambda s: pytest.fail("slept"))
    hvd = Handles(polls_needed=0)
    assert waiting.synchronize(hvd, 1) == "output of 1" and hvd.polls == 1


@pytest.mark.parametrize("value", ["horovod", " Horovod "])
def test_the_environment_turns_polling_off(monkeypatch, value):
    monkeypatch.setenv(waiting.WAIT_ENV, value)
    hvd = Handles(polls_needed=5)
    assert not waiting.polls(hvd)
    assert waiting.synchronize(hvd, 3) == "output of 3" and hvd.polls == 0


def test_an_hvd_without_poll_is_synchronized_directly(monkeypatch):
    monkeypatch.delenv(waiting.WAIT_ENV, raising=False)

    class NoPoll:
        def synchronize(self, handle):
            return handle * 2

    assert not waiting.polls(NoPoll()) and waiting.synchronize(NoPoll(), 21) == 42
