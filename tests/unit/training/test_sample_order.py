"""The deterministic sample order: a stream of per-epoch permutations, cut into global
batches and split over workers, independent of the number of workers."""

import pytest

from eft.training.config import steps_for
from eft.training.data import epoch_permutation, global_batch_indices, shard_for_rank


def test_each_epoch_visits_every_example_once():
    n, g = 37, 8
    stream = [i for step in range(steps_for(n, g, 3)) for i in global_batch_indices(n, 5, step, g)]
    for epoch in range(3):
        assert sorted(stream[epoch * n:(epoch + 1) * n]) == list(range(n))


def test_order_depends_on_seed_and_epoch():
    assert list(epoch_permutation(50, 1, 0)) == list(epoch_permutation(50, 1, 0))
    assert list(epoch_permutation(50, 1, 0)) != list(epoch_permutation(50, 2, 0))
    assert list(epoch_permutation(50, 1, 0)) != list(epoch_permutation(50, 1, 1))


@pytest.mark.parametrize("world", [1, 2, 3, 5])
def test_shards_partition_the_global_batch(world):
    batch = global_batch_indices(100, 0, 4, 16)
    shards = [shard_for_rank(batch, r, world) for r in range(world)]
    assert [i for s in shards for i in s] == batch
    sizes = [len(s) for s in shards]
    assert max(sizes) - min(sizes) <= 1


def test_steps_cover_epochs_without_dropping():
    assert steps_for(100, 16, 1) == 7
    assert steps_for(100, 10, 2.5) == 25
    assert steps_for(3, 16, 1) == 1
