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
