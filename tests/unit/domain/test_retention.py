from __future__ import annotations

from tuneforge.domain.retention import kept_steps

# a run of 3 epochs of 3 steps with a checkpoint every 4 steps as well
RUN = [(3, True), (4, False), (6, True), (8, False), (9, True)]


def test_by_epoch_keeps_the_newest_epoch_ends_and_the_newest_checkpoint():
    assert kept_steps(RUN, 2, by_epoch=True) == {9, 6}
    assert kept_steps(RUN[:4], 2, by_epoch=True) == {8, 6, 3}  # mid-epoch: 8 is what a restart resumes from
    assert kept_steps(RUN[:4], 1, by_epoch=True) == {8, 6}
    assert kept_steps([(5, False)], 3, by_epoch=True) == {5}


def test_by_count_keeps_the_newest():
    assert kept_steps(RUN, 2, by_epoch=False) == {9, 8}


def test_keep_last_zero_keeps_everything():
    assert kept_steps(RUN, 0, by_epoch=True) == {3, 4, 6, 8, 9}
    assert kept_steps([], 3, by_epoch=True) == set()
