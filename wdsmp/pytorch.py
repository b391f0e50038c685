"""torch's names that code written for webdataset imports from its ``pytorch`` submodule.

webdataset keeps stand-ins there for installs without torch; wdsmp requires torch, so these
are torch's own classes.
"""

from torch import Tensor as TorchTensor
from torch.utils.data import DataLoader, IterableDataset

__all__ = ["DataLoader", "IterableDataset", "TorchTensor"]
