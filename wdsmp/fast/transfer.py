"""Batches to the GPU: from shared memory, pinned, copied and normalised on a side stream.

NOTE [pinned transfer]
    * The ring is registered with CUDA as page-locked host memory
      (``cudaHostRegister``, portable to every device) the first time
      ``.cuda()`` iterates, on the loader's device, so a slot is copied to
      the device by DMA straight from shared memory: no staging copy on the
      CPU. Where registration fails (some containers limit locked memory;
      confidential-computing GPUs refuse it), the loader warns once with
      CUDA's error, ``stats`` and the bottleneck line say so, and each batch
      is copied into one of ``depth + 1`` pinned staging buffers instead.
    * Everything runs on a side stream of the loader's device, inside
      ``torch.cuda.device(device)`` and never across a ``yield``: the copy of
      a slot's views (never a CPU copy of them, also with ``copy=True``),
      then the dtype conversion and normalisation, one kernel computing in
      float32 and rounding once (``to_model_input``). Up to ``depth``
      batches are under way ahead of the one handed out, taken as their
      workers deliver them: the loader never waits for a later batch to hand
      out an earlier one. The consumer's stream waits on an event recorded
      after the batch's last kernel, and its tensors are marked as used on
      that stream (``record_stream``), so the caching allocator does not
      hand their memory out early; the normalisation overlaps the training
      step running on the consumer's stream.
    * A slot goes back to its worker only once its copy has completed (a
      second event, recorded after the copies): a worker never overwrites
      memory the GPU is still reading. Slots whose copies are done go back
      before each new batch is taken, and at the latest when the batch is
      handed out (its copy was issued a batch earlier, so waiting for it
      costs nothing). The loader waits for a worker only when no batch is
      in flight, so every slot has gone back by then: no worker can be left
      without a slot to fill. Before new workers start (an epoch left
      unfinished), the loader's side streams are waited for, in case a
      suspended iterator's copies are still reading.
    * After a CUDA error that breaks the context (a device-side assert in the
      training step), ``close()`` still stops the workers and frees the ring:
      the waits that fail are skipped, the ring is not unregistered (the
      context that registered it is gone), and the user's exception is the
      one that propagates.
    * NVTX ranges (``wdsmp.wait``, ``wdsmp.h2d``, ``wdsmp.normalise``) mark
      the host's share of each, for Nsight Systems.
"""

import collections
import os
import warnings
from time import perf_counter_ns
from types import ModuleType
from typing import (TYPE_CHECKING, Any, Callable, Deque, Dict, Iterable, Iterator, List, Mapping, Optional, Protocol,
                    SupportsInt, Tuple, Union, cast)

from .._internal.validation import positive_int

if TYPE_CHECKING:
    import numpy as np
    import torch

    from .batches import Batch, SlotTensors
    from .messages import BatchReady
    from .ring import Ring
    from .stats import LoaderStats

__all__ = ["CudaLoader", "rank_device_warning", "to_model_input"]

# A pinned staging buffer set: (the event of the copy that last read it, its tensors).
_Staged = Tuple["torch.cuda.Event", List["torch.Tensor"]]


# What this module uses of the loader's objects, as protocols: loader.py, delivery.py and resources.py import
# this module, so it does not import them.


class _Resources(Protocol):
    """What the pinning uses of a ``resources.LoaderResources``."""

    pinned: Optional["PinnedRing"]

    @property
    def ring(self) -> "Ring": ...

    def on_close(self, cleanup: Callable[[], object]) -> None: ...


class _Delivery(Protocol):
    """What ``CudaLoader`` uses of an epoch's ``delivery.Delivery``."""

    @property
    def resources(self) -> _Resources: ...

    @property
    def slots(self) -> "SlotTensors": ...

    @property
    def stats(self) -> "LoaderStats": ...

    def next_message(self, wait: bool = True) -> Optional["BatchReady"]: ...

    def hand(self, message: "BatchReady") -> None: ...

    def release(self, message: "BatchReady") -> None: ...

    def abandon(self) -> None: ...


class _EpochIterator(Protocol):
    """What ``CudaLoader`` uses of a ``delivery.EpochIterator``."""

    @property
    def delivery(self) -> _Delivery: ...

    def __next__(self) -> "Batch": ...


class _Loader(Protocol):
    """What ``CudaLoader`` uses of a ``FastLoader``."""

    def __len__(self) -> int: ...

    def __iter__(self) -> _EpochIterator: ...


def _clear_cuda_error(torch: ModuleType) -> None:
    """Reset the calling thread's last CUDA runtime error after a failed runtime call made
    outside torch (``cudaHostRegister``), so that torch's next launch check does not report it
    against an unrelated kernel: a one-element kernel, whose launch check reads the stale error
    (raising it here, where it is expected) and so clears it, however cudart is linked."""
    try:
        torch.ones(1, device=torch.cuda.current_device())
    except RuntimeError:
        pass


def _cuda_error(cudart: ModuleType, result: SupportsInt) -> str:
    """CUDA's message for ``result``, a cudaError returned by a ``torch.cuda.cudart()`` call."""
    try:
        return f"{cudart.cudaGetErrorString(result)} (cudaError {int(result)})"
    except (AttributeError, TypeError):
        return f"cudaError {int(result)}"


class PinnedRing:
    """The ring's registration with CUDA, made on ``device``: ``ok`` (True when pinned),
    ``error`` (CUDA's message when registration failed), and the loader's side streams, one
    per device, which copy from it (``readers``): waited for before new workers write into its
    slots and before it is unregistered at the loader's close."""

    error: Optional[str]
    _memory: "Optional[np.ndarray]"

    def __init__(self, resources: _Resources, device: "torch.device") -> None:
        import numpy as np
        import torch

        memory = np.frombuffer(resources.ring.buffer, np.uint8)
        self.pointer, self.device, self.error = memory.ctypes.data, device, None
        self.readers: Dict["torch.device", "torch.cuda.Stream"] = {}  # device -> the loader's side stream there
        cudart = torch.cuda.cudart()
        with torch.cuda.device(device):
            result = cudart.cudaHostRegister(self.pointer, memory.nbytes, 1)  # 1: cudaHostRegisterPortable
            if int(result) != 0:
                _clear_cuda_error(torch)
        self.ok = int(result) == 0
        if not self.ok:
            self.error = _cuda_error(cudart, result)
            return
        self._memory = memory  # keeps the mapping alive while it is registered
        resources.on_close(self.unregister)

    def side_stream(self, device: "torch.device") -> "torch.cuda.Stream":
        """The loader's side stream on ``device``: one per loader and device, whatever the
        number of ``.cuda()`` objects and epochs."""
        import torch

        if device not in self.readers:
            self.readers[device] = torch.cuda.Stream(device)
        return self.readers[device]

    def wait(self) -> None:
        """Wait for the copies that may still read the ring (a ``.cuda()`` iterator left
        suspended): only the loader's own streams, not the device's others."""
        for stream in self.readers.values():
            stream.synchronize()

    def unregister(self) -> None:
        """``wait()``, then unregister the ring. After an error that broke the CUDA context
        neither is possible: the registration went with the context."""
        import torch

        try:
            self.wait()
            cudart = torch.cuda.cudart()
            with torch.cuda.device(self.device):
                result = cudart.cudaHostUnregister(self.pointer)
                if int(result) != 0:
                    _clear_cuda_error(torch)
                    raise RuntimeError(_cuda_error(cudart, result))
        except RuntimeError as exn:
            warnings.warn(f"FastLoader.close(): the ring was not unregistered from CUDA ({exn})", RuntimeWarning,
                          stacklevel=2)
        self._memory = None


def pin(resources: _Resources, device: "torch.device") -> PinnedRing:
    """The ring of ``resources`` (a ``LoaderResources``) registered with CUDA once per loader
    (a ``PinnedRing``); a failure warns once."""
    pinned = resources.pinned
    if pinned is None:
        pinned = resources.pinned = PinnedRing(resources, device)
        if not pinned.ok:
            warnings.warn(f"FastLoader.cuda(): the ring could not be registered as pinned memory "
                          f"({pinned.error}); each batch is staged through a pinned copy instead, which "
                          f"costs CPU time (stats['pinned'] and the bottleneck line say so)", RuntimeWarning,
                          stacklevel=3)
    return pinned


def rank_device_warning(device_index: int, environ: Mapping[str, str], device_count: int) -> Optional[str]:
    """The warning for batches going to ``cuda:device_index`` in a process that torchrun (or
    another launcher setting ``LOCAL_RANK``) started as another local rank, where that rank's
    GPU is visible; None when nothing looks wrong."""
    local_rank = environ.get("LOCAL_RANK", "")
    if not local_rank.isdigit() or int(local_rank) == device_index or int(local_rank) >= device_count:
        return None
    return (f"FastLoader.cuda(): LOCAL_RANK is {local_rank} but batches go to cuda:{device_index} (the current "
            f"device): every rank would feed the same GPU. Pass device=f'cuda:{{local_rank}}' or call "
            f"torch.cuda.set_device(local_rank) first")


def to_model_input(images: "torch.Tensor", *, scale: Optional["torch.Tensor"] = None,
                   bias: Optional["torch.Tensor"] = None, dtype: Optional["torch.dtype"] = None,
                   channels_last: bool = True) -> "torch.Tensor":
    """NHWC uint8 ``images`` (any device) as the model takes them: NCHW in ``channels_last``
    memory (no copy for uint8) or contiguous; with ``scale`` and ``bias`` (float32, shape
    ``(1, 3, 1, 1)``), ``images * scale + bias`` computed in float32 and rounded once to
    ``dtype``, in one kernel; with ``dtype`` alone, converted."""
    import torch

    images = images.permute(0, 3, 1, 2)
    layout = torch.channels_last if channels_last else torch.contiguous_format
    if scale is None and (dtype is None or dtype == images.dtype):
        return images.contiguous(memory_format=layout)
    out = torch.empty(images.shape, dtype=dtype or torch.float32, device=images.device, memory_format=layout)
    if scale is None:
        return out.copy_(images)
    return torch.addcmul(cast("torch.Tensor", bias), images, scale, out=out)


class _InFlight:
    """A batch under way: its message, its GPU batch, the event after its copies
    (``copied``: its slot may go back) and after its last kernel (``ready``), and whether its
    slot went back."""

    __slots__ = ("message", "batch", "started", "copied", "ready", "released")

    def __init__(self, message: "BatchReady", batch: "Batch", started: "torch.cuda.Event", copied: "torch.cuda.Event",
                 ready: "torch.cuda.Event") -> None:
        self.message, self.batch, self.started, self.copied, self.ready = message, batch, started, copied, ready
        self.released = False


class CudaLoader:
    """Iterate ``loader`` with batches on a CUDA device (NOTE [pinned transfer]).

    ``device``: a CUDA device (default: the current one; under torchrun pass
    ``f"cuda:{local_rank}"`` or call ``torch.cuda.set_device``, a mismatch with ``LOCAL_RANK``
    warns). ``mean``/``std``: per-channel values on the 0-255 pixel scale (as FFCV and DALI
    take them), applied on the GPU in float32 and rounded once; with them images become
    ``dtype`` (default float32; ``torch.bfloat16`` and ``torch.float16`` work), without them
    they stay uint8 unless ``dtype`` is given. Images come out NCHW; ``channels_last=True``
    (default) keeps the NHWC bytes underneath (``torch.channels_last``), what convolutions
    on tensor cores want, at no cost; ``False`` makes them contiguous NCHW. ``depth``: batches
    copied and normalised ahead of the one handed out, as their workers deliver them (the
    loader never waits for a later batch). Batches are ``Batch`` tuples, as on the CPU, and
    stay valid as long as they are referenced (``copy=True`` changes nothing here).
    """

    scale: "Optional[torch.Tensor]"
    bias: "Optional[torch.Tensor]"
    stream: "Optional[torch.cuda.Stream]"

    def __init__(self, loader: _Loader, device: Union[str, int, "torch.device", None] = None, *,
                 mean: Optional[Iterable[float]] = None, std: Optional[Iterable[float]] = None,
                 dtype: Optional["torch.dtype"] = None, channels_last: bool = True, depth: int = 2) -> None:
        import torch

        positive_int(depth, "depth")
        if (mean is None) != (std is None):
            raise ValueError("give both mean and std, or neither")
        if mean is not None:
            mean, std = _channel_values(mean, "mean"), _channel_values(std, "std")
            if not all(value > 0 for value in std):
                raise ValueError(f"std must be positive (it divides), not {std!r}")
            dtype = torch.float32 if dtype is None else dtype
        if dtype is not None and not isinstance(dtype, torch.dtype):
            raise ValueError(f"dtype must be a torch dtype, not {dtype!r}")
        if mean is not None and not cast("torch.dtype", dtype).is_floating_point:
            raise ValueError(f"normalised images need a floating dtype, not {dtype}")
        if not torch.cuda.is_available():
            raise RuntimeError("FastLoader.cuda() needs a CUDA device, and torch.cuda.is_available() is False "
                               "here (a CPU build of torch, or no GPU visible); iterate the loader itself for "
                               "CPU batches")
        self.loader = loader
        self.device = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
        if self.device.type != "cuda":
            raise ValueError(f"device must be a CUDA device, not {device!r}")
        if self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        message = rank_device_warning(self.device.index, os.environ, torch.cuda.device_count())
        if message is not None:
            warnings.warn(message, RuntimeWarning, stacklevel=3)
        self.dtype, self.channels_last, self.depth = dtype, bool(channels_last), depth
        self.scale = self.bias = None
        if mean is not None:
            mean64 = torch.tensor(mean, dtype=torch.float64).reshape(1, 3, 1, 1)
            std64 = torch.tensor(std, dtype=torch.float64).reshape(1, 3, 1, 1)
            self.scale = (1.0 / std64).float().to(self.device)
            self.bias = (-mean64 / std64).float().to(self.device)
        self.stream = None  # the loader's side stream on ``device``, from the first iteration on

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator["Batch"]:
        import torch

        batches = iter(self.loader)  # held here: it holds the loader (NOTE [shutdown order] in loader.py)
        epoch = batches.delivery
        stats = epoch.stats
        pinned = pin(epoch.resources, self.device)
        stats.pinning(pinned.ok, pinned.error)
        self.stream = pinned.side_stream(self.device)
        staging: Optional[List[Optional[_Staged]]] = None if pinned.ok else [None] * (self.depth + 1)
        inflight: Deque[_InFlight]
        entry: Optional[_InFlight]
        inflight, issued, exhausted = collections.deque(), 0, False
        try:
            while True:
                # Take what the workers delivered, up to ``depth`` ahead; wait only for the next
                # one (then nothing is in flight: every slot went back).
                start = perf_counter_ns()
                self._release_done(epoch, inflight, stats)
                stats.add_transfer(perf_counter_ns() - start)
                while not exhausted and len(inflight) <= self.depth:
                    try:
                        with torch.cuda.nvtx.range("wdsmp.wait"):
                            message = epoch.next_message(wait=not inflight)
                    except StopIteration:
                        exhausted = True
                        break
                    if message is None:
                        break
                    start = perf_counter_ns()
                    inflight.append(self._start(epoch, message, staging, issued % len(staging or [0])))
                    stats.add_transfer(perf_counter_ns() - start)
                    issued += 1
                if not inflight:
                    return
                start = perf_counter_ns()
                entry = inflight.popleft()
                self._hand_out(epoch, entry, stats)
                current = torch.cuda.current_stream(self.device)
                current.wait_event(entry.ready)
                for tensor in _tensors(entry.batch):
                    tensor.record_stream(current)
                epoch.hand(entry.message)
                stats.add_transfer(perf_counter_ns() - start)
                stats.handed()
                batch, entry = entry.batch, None
                yield batch
                stats.returned()
        finally:
            try:
                for entry in inflight:
                    self._give_back(epoch, entry, stats)
            except RuntimeError:  # the CUDA context is broken: the epoch cannot go on
                epoch.abandon()

    def _hand_out(self, epoch: _Delivery, entry: _InFlight, stats: "LoaderStats") -> None:
        """The batch of ``entry`` goes out: its copy is done (it was issued a batch ago, so the
        wait is normally nil), its slot goes back, its copy time is counted."""
        self._give_back(epoch, entry, stats)
        stats.add_h2d(int(entry.started.elapsed_time(entry.copied) * 1e6))

    def _give_back(self, epoch: _Delivery, entry: _InFlight, stats: "LoaderStats") -> None:
        """Wait for the copy of ``entry`` (counted as the host's wait for copies), then give its
        slot back (a staged batch's went back at once)."""
        start = perf_counter_ns()
        entry.copied.synchronize()
        stats.add_copy_wait(perf_counter_ns() - start)
        if not entry.released:
            entry.released = True
            epoch.release(entry.message)

    def _release_done(self, epoch: _Delivery, inflight: Iterable[_InFlight], stats: "LoaderStats") -> None:
        """Give back the slots whose copies are done (never waiting)."""
        for entry in inflight:
            if not entry.released and entry.copied.query():
                self._give_back(epoch, entry, stats)

    def _start(self, epoch: _Delivery, message: "BatchReady", staging: Optional[List[Optional[_Staged]]],
               index: int) -> _InFlight:
        """Start copying the slot of ``message`` to the device and normalising it, on the side
        stream; an ``_InFlight``."""
        import torch

        cpu = epoch.slots.views(message)
        with torch.cuda.device(self.device), torch.cuda.stream(self.stream):
            started, copied, ready = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True),
                                      torch.cuda.Event())
            with torch.cuda.nvtx.range("wdsmp.h2d"):
                sources = _tensors(cpu)
                if staging is not None:
                    sources = _stage(staging[index], sources)
                started.record()
                moved = [t.to(self.device, non_blocking=True) for t in sources]
                copied.record()
            with torch.cuda.nvtx.range("wdsmp.normalise"):
                moved[0] = to_model_input(moved[0], scale=self.scale, bias=self.bias, dtype=self.dtype,
                                          channels_last=self.channels_last)
                ready.record()
        entry = _InFlight(message, _rebuild(cpu, moved), started, copied, ready)
        if staging is not None:  # the slot's bytes are in the staging buffers now
            staging[index] = (copied, sources)
            entry.released = True
            epoch.release(message)
        return entry


def _stage(previous: Optional[_Staged], tensors: List["torch.Tensor"]) -> List["torch.Tensor"]:
    """``tensors`` copied into pinned staging buffers: those of ``previous`` (``(the event of
    the copy that last read them, buffers)``, or None), once that copy is done, where they fit;
    else new ones."""
    import torch

    if previous is not None and [b.shape for b in previous[1]] == [t.shape for t in tensors]:
        previous[0].synchronize()
        return [b.copy_(t) for b, t in zip(previous[1], tensors)]
    return [torch.empty_like(t, pin_memory=True).copy_(t) for t in tensors]


def _channel_values(values: Any, name: str) -> Tuple[float, ...]:
    """Three finite floats (R, G, B) from ``values``."""
    import math

    try:
        values = tuple(float(v) for v in values)
    except (TypeError, ValueError):
        raise ValueError(f"{name} needs 3 numbers (R, G, B), not {values!r}") from None
    if len(values) != 3 or not all(math.isfinite(v) for v in values):
        raise ValueError(f"{name} needs 3 finite numbers (R, G, B), not {values!r}")
    return values


def _tensors(batch: "Batch") -> List["torch.Tensor"]:
    """The batch's tensors in a fixed order: images, labels (if any), declared fields."""
    tensors = [batch.images]
    if batch.labels is not None:
        tensors.append(batch.labels)
    tensors.extend(batch.fields[name] for name in sorted(batch.fields))
    return tensors


def _rebuild(batch: "Batch", tensors: Iterable["torch.Tensor"]) -> "Batch":
    """A batch like ``batch`` holding ``tensors`` (in ``_tensors`` order)."""
    tensors = list(tensors)
    images = tensors.pop(0)
    labels = tensors.pop(0) if batch.labels is not None else None
    fields = dict(zip(sorted(batch.fields), tensors))
    return type(batch)(images, labels, batch.keys, fields, batch.epoch)
