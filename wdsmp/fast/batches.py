"""What the loader hands out: a ring slot seen as a ``Batch`` of tensors (NOTE [batch lifetime]
in ``loader.py``)."""

from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

if TYPE_CHECKING:
    from .messages import BatchReady
    from .ring import Ring

from .worker import IMAGES, KEYS, LABELS

__all__ = ["Batch", "SlotTensors"]


class Batch(tuple):
    """``(images, labels)``, so ``for images, labels in loader`` works, plus ``keys`` (a list
    of str when ``keys=True``, else None), ``fields`` (``{name: tensor}`` of declared
    fields), ``count`` (rows) and ``epoch``."""

    keys: Optional[List[str]]
    fields: Dict[str, Any]
    epoch: Optional[int]

    def __new__(cls, images: Any, labels: Any, keys: Optional[List[str]] = None,
                fields: Optional[Dict[str, Any]] = None, epoch: Optional[int] = None) -> "Batch":
        batch = super().__new__(cls, (images, labels))
        batch.keys, batch.fields, batch.epoch = keys, dict(fields or {}), epoch
        return batch

    def __getnewargs__(self) -> Tuple[Any, ...]:  # copy and pickle; the attributes follow in __dict__
        return tuple(self)

    @property
    def images(self) -> Any:
        return self[0]

    @property
    def labels(self) -> Any:
        return self[1]

    @property
    def count(self) -> int:  # type: ignore[override]  # the rows, as a property: not tuple.count(value)
        return len(self[0])


class SlotTensors:
    """The slots of ``ring`` as ``Batch``es of tensors: views of the slot (no copy), or with
    ``copy=True`` copies, so the slot can go back to its worker at once; ``channels_first``
    gives NCHW views of the NHWC images."""

    def __init__(self, ring: "Ring", *, copy: bool = False, channels_first: bool = False) -> None:
        self.ring, self.copy, self.channels_first = ring, copy, channels_first

    def batch(self, message: "BatchReady") -> Batch:
        """The slot of ``message`` (a ``BatchReady``), its first ``message.count`` rows, as the
        loader's options say (copied, channels first)."""
        batch = self.views(message)
        images, labels, fields = batch.images, batch.labels, batch.fields
        if self.copy:
            images, fields = images.clone(), {name: tensor.clone() for name, tensor in fields.items()}
            labels = labels.clone() if labels is not None else None
        if self.channels_first:
            images = images.permute(0, 3, 1, 2)
        return Batch(images, labels, batch.keys, fields, batch.epoch)

    def labels(self, message: "BatchReady") -> Any:
        """The labels of ``message``'s slot, its first ``message.count`` rows, as a numpy view (None
        without labels)."""
        labels = self.ring.views(message.slot).get(LABELS)
        return None if labels is None else labels[:message.count]

    def views(self, message: "BatchReady") -> Batch:
        """The slot of ``message``, its first ``message.count`` rows, as views (images NHWC),
        whatever the options: what ``.cuda()`` copies to the device."""
        import torch

        arrays = self.ring.views(message.slot)
        count = message.count
        tensors = {name: torch.from_numpy(array[:count] if count < len(array) else array)
                   for name, array in arrays.items() if name != KEYS}
        images = tensors.pop(IMAGES)
        labels = tensors.pop(LABELS, None)
        keys = [k.decode() for k in arrays[KEYS][:count]] if KEYS in arrays else None
        return Batch(images, labels, keys, tensors, message.epoch)
