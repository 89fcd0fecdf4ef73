"""transferset/runtime/deadline.py: the time a budget gives the block in progress, none outside one."""
from transferset.runtime import deadline


def test_a_block_has_its_seconds_and_the_one_around_it_comes_back_after():
    assert deadline.seconds_left() is None and deadline.room_for(1e9)
    with deadline.within(3600.0):
        assert 3590 < deadline.seconds_left() <= 3600 and deadline.room_for(60) and not deadline.room_for(3601)
        with deadline.within(-5.0):  # a share already spent: no room for anything
            assert deadline.seconds_left() <= 0 and not deadline.room_for(0.001)
        with deadline.within(None):  # a stage the budget does not limit (the search)
            assert deadline.seconds_left() is None and deadline.room_for(1e9)
        assert 3590 < deadline.seconds_left() <= 3600
    assert deadline.seconds_left() is None


def test_the_part_of_an_epoch_is_what_the_time_left_holds_once_evaluated_and_none_under_half():
    assert deadline.part_of_epoch(10.0, 1.0) == 0.0  # no deadline: whole epochs
    with deadline.within(7.0):
        assert 0.59 < deadline.part_of_epoch(10.0, 1.0) <= 0.6  # (7 - 1) / 10
        assert deadline.part_of_epoch(10.0, 3.0) == 0.0  # (7 - 3) / 10: under MIN_PART
        assert deadline.part_of_epoch(4.0, 1.0) == 0.99  # a whole one fits: room_for says so first
    with deadline.within(-1.0):
        assert deadline.part_of_epoch(10.0, 1.0) == 0.0


def test_the_step_a_phase_ends_at_counts_the_whole_epochs_that_fit_then_a_part_of_at_least_half():
    """A phase of 4 epochs of 10 steps, 1 trained, epochs of 100 s evaluated in 10 s: end_step says where the trainer
    will stop (the schedule's end), as room_for and part_of_epoch decide epoch by epoch."""
    end = lambda left: deadline.end_step(10, 1, 4, left, 100.0, 10.0)  # noqa: E731
    assert end(250.0) == 30  # 2 more whole (220 s), the 0.2 left of a third not trained
    assert end(290.0) == 36  # then 0.6 of the third (60 s and its 10 s evaluation)
    assert end(1000.0) == 40 and end(330.0) == 40  # every planned epoch
    assert end(-5.0) == 10  # the epoch under way ends the phase
