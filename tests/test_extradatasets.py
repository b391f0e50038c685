"""Tests of wdsmp.extradatasets: mock data, repetition, epochs and lengths, in and out of DataLoaders."""

import pickle

import pytest
import torch.utils.data

from wdsmp.extradatasets import MockDataset, repeatedly, with_epoch, with_length
from wdsmp.pipeline import DataPipeline


def test_mock_dataset():
    dataset = MockDataset({"x": 1}, 4)
    assert list(dataset) == [{"x": 1}] * 4
    assert list(dataset) == [{"x": 1}] * 4  # every pass is the same
    assert list(MockDataset("s", 0)) == []
    with pytest.raises(ValueError, match="non-negative int"):
        MockDataset("s", -1)


def test_mock_dataset_in_spawned_workers():
    loader = torch.utils.data.DataLoader(MockDataset(3, 5), num_workers=2, batch_size=None,
                                         multiprocessing_context="spawn")
    assert list(loader) == [3] * 10  # each worker yields the whole mock dataset, as webdataset's does


def test_repeatedly_as_a_dataset():
    assert list(repeatedly(range(3), nepochs=2)) == [0, 1, 2, 0, 1, 2]
    assert list(repeatedly(range(3), nbatches=4)) == [0, 1, 2, 0]
    assert list(repeatedly([], nepochs=None)) == []  # an empty pass ends an endless repeat
    assert len(repeatedly(range(3), nepochs=2, length=6)) == 6
    with pytest.raises(TypeError, match="no length"):
        len(repeatedly(range(3)))
    with pytest.raises(ValueError, match="no source"):
        iter(repeatedly())


def test_repeatedly_as_a_stage():
    assert list(repeatedly(nepochs=3).run([0, 1])) == [0, 1] * 3
    assert list(repeatedly(nbatches=3).invoke(range(2))) == [0, 1, 0]
    # A DataPipeline hands stages an iterator: it runs dry after one pass, which ends the repeat.
    assert list(DataPipeline(range(2), repeatedly(nepochs=3))) == [0, 1]


def test_with_epoch_starts_each_epoch_afresh():
    dataset = with_epoch(range(5), 3)
    assert len(dataset) == 3
    assert list(dataset) == list(dataset) == [0, 1, 2]  # as webdataset's, after a whole epoch
    assert list(with_epoch(range(2), 5)) == [0, 1, 0, 1, 0]  # passes repeat within an epoch


def test_with_epoch_continuous_continues_through_the_data():
    dataset = with_epoch(range(5), 3, continuous=True)
    assert len(dataset) == 3
    assert list(dataset) == [0, 1, 2]
    assert list(dataset) == [3, 4, 0]  # the next epoch goes on, wrapping around
    assert list(dataset) == [1, 2, 3]
    assert list(with_epoch([], 3)) == list(with_epoch([], 3, continuous=True)) == []
    with pytest.raises(ValueError, match="non-negative int"):
        with_epoch(range(3), 1.5)


def test_with_epoch_pickles_without_its_iterator():
    dataset = with_epoch(range(5), 3, continuous=True)
    assert list(dataset) == [0, 1, 2]
    copy = pickle.loads(pickle.dumps(dataset))
    assert copy.source is None and list(copy) == [0, 1, 2]  # the copy starts its own pass
    assert list(dataset) == [3, 4, 0]


def test_with_epoch_in_spawned_workers():
    loader = torch.utils.data.DataLoader(with_epoch(range(4), 6), num_workers=2, batch_size=None,
                                         multiprocessing_context="spawn")
    assert sorted(loader) == sorted([0, 1, 2, 3, 0, 1] * 2)


def test_with_length():
    dataset = with_length(range(3), 10)
    assert len(dataset) == 10
    assert list(dataset) == [0, 1, 2]  # the length changes nothing else
    assert list(DataPipeline(range(3), with_length(None, 1))) == [0, 1, 2]
    assert len(pickle.loads(pickle.dumps(dataset))) == 10
    with pytest.raises(ValueError, match="non-negative int"):
        with_length(range(3), -2)
