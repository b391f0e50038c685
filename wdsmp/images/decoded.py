"""``DecodedSamples``: what ``autodecode.Decoder(...)(dataset)`` returns, a torch dataset of the
decoded samples. Apart from ``autodecode`` so that decoding itself does not import torch."""

from typing import Any, Callable, Dict, Iterable, Iterator, Union

from torch.utils.data import IterableDataset

__all__ = ["DecodedSamples"]


class DecodedSamples(IterableDataset):
    """A dataset's samples, each decoded: what ``Decoder(...)(dataset)`` returns.

    ``samples`` is an iterable (an IterableDataset, a DataLoader, a list) or a
    callable returning an iterator, as a pipeline's source may be. Only the
    two travel, so it pickles for DataLoader workers whenever they do.
    """

    def __init__(self, samples: Union[Iterable[Dict[str, Any]], Callable[[], Iterable[Dict[str, Any]]]],
                 decoder: Any) -> None:  # an autodecode.Decoder (not imported: it imports this module)
        super().__init__()
        self.samples, self.decoder = samples, decoder

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        samples = self.samples if hasattr(self.samples, "__iter__") else self.samples()
        for sample in samples:
            yield self.decoder.decode(sample)

    def set_epoch(self, epoch: int) -> None:
        """Passed on to the samples' dataset, if it has epochs."""
        if hasattr(self.samples, "set_epoch"):
            self.samples.set_epoch(epoch)
