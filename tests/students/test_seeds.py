"""The run's random streams come from SeedSequence(seed), as the augmenters' do."""
import numpy as np

from students import seeds


def test_stream_is_the_spawned_child_and_streams_differ():
    root = np.random.SeedSequence(7)
    shuffle = root.spawn(3)[seeds.SHUFFLE]
    epoch = shuffle.spawn(2)[1].spawn(3)[2]  # phase 1, epoch 2
    assert np.array_equal(seeds.stream(7, seeds.SHUFFLE, 1, 2).generate_state(4), epoch.generate_state(4))
    states = {tuple(seeds.stream(s, w, *p).generate_state(2)) for s in (0, 1)
              for w, p in [(seeds.INIT, ()), (seeds.DROPOUT, ()), (seeds.SHUFFLE, (0, 0)), (seeds.SHUFFLE, (0, 1))]}
    assert len(states) == 8
    t = seeds.torch_seed(seeds.stream(0, seeds.INIT))
    assert 0 <= t < 2 ** 63 and t == seeds.torch_seed(seeds.stream(0, seeds.INIT))
