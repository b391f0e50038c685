"""Batches to the GPU: from shared memory, pinned, copied on a side stream.

NOTE [pinned transfer]
    * The ring is registered with CUDA as page-locked host memory
      (``cudaHostRegister``) the first time ``.cuda()`` iterates, so a slot
      is copied to the device by DMA straight from shared memory: no
      staging copy on the CPU. Where registration fails (some containers
      limit locked memory), each batch is copied into one of ``depth``
      pinned staging buffers instead, and its slot is freed at once.
    * Copies run ``non_blocking`` on a side stream, up to ``depth`` batches
      ahead of the one handed out; the consumer's stream waits on a CUDA
      event recorded after each copy, so the batch is complete when its
      kernels run, and the tensors are marked as used on that stream so the
      caching allocator does not hand their memory out early.
    * A slot goes back to its worker only once the event of its copy has
      completed: a worker never overwrites memory the GPU is still reading.
      Events are checked without blocking before each new batch is taken,
      and waited for when the worker due next holds no free slot (it could
      never deliver the batch the loader waits for) and at the end.
    * Normalisation and dtype conversion run on the GPU, on the consumer's
      stream, after the copy.
"""

import collections
from time import perf_counter_ns

from ..validation import positive_int

__all__ = ["CudaLoader"]


def _clear_cuda_error():
    """Reset CUDA's sticky last error after a failed runtime call made outside torch, so that
    torch's next check does not report it against an unrelated kernel."""
    import ctypes

    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if "libcudart" in line}
    for path in paths:
        ctypes.CDLL(path).cudaGetLastError()


def _register(resources):
    """Register the ring of ``resources`` (a ``LoaderResources``) with CUDA once per loader;
    False when that failed (then and before). Unregistered at the loader's close, after the
    device is idle."""
    import numpy as np
    import torch

    if resources.pinned is not None:
        return resources.pinned
    memory = np.frombuffer(resources.ring.buffer, np.uint8)
    pointer, size = memory.ctypes.data, memory.nbytes
    cudart = torch.cuda.cudart()
    if int(cudart.cudaHostRegister(pointer, size, 0)) != 0:
        _clear_cuda_error()
        resources.pinned = False
        return False
    memory_ref = [memory]  # keeps the mapping alive while it is registered

    def unregister():
        torch.cuda.synchronize()  # no copy may still read it (a .cuda() iterator left suspended)
        cudart.cudaHostUnregister(pointer)
        del memory_ref[:]

    resources.on_close(unregister)
    resources.pinned = True
    return True


class CudaLoader:
    """Iterate ``loader`` with batches on a CUDA device (NOTE [pinned transfer]).

    ``device``: a CUDA device (default: the current one). ``mean``/``std``: per-channel
    values on the 0-255 pixel scale (as FFCV and DALI take them), applied on the GPU; with
    them images become ``dtype`` (default float32; ``torch.bfloat16`` works), without them
    they stay uint8 unless ``dtype`` is given. Images come out NCHW; ``channels_last=True``
    (default) keeps the NHWC bytes underneath (``torch.channels_last``), which is what
    convolutions on tensor cores want and costs no copy; ``False`` makes them contiguous
    NCHW. ``depth``: batches copied ahead (an epoch's first batch goes out without waiting for
    the next). Batches are ``Batch`` tuples, as on the CPU.
    """

    def __init__(self, loader, device=None, *, mean=None, std=None, dtype=None, channels_last=True, depth=2):
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("FastLoader.cuda() needs a CUDA device, and torch.cuda.is_available() is False "
                               "here (a CPU build of torch, or no GPU visible); iterate the loader itself for "
                               "CPU batches")
        self.loader = loader
        self.device = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
        if self.device.type != "cuda":
            raise ValueError(f"device must be a CUDA device, not {device!r}")
        positive_int(depth, "depth")
        if (mean is None) != (std is None):
            raise ValueError("give both mean and std, or neither")
        self.dtype = dtype if dtype is not None else (torch.float32 if mean is not None else None)
        if mean is not None:
            self.mean = torch.tensor(mean, dtype=torch.float32, device=self.device).reshape(1, -1, 1, 1)
            self.scale = 1.0 / torch.tensor(std, dtype=torch.float32, device=self.device).reshape(1, -1, 1, 1)
            if self.mean.numel() != 3 or self.scale.numel() != 3:
                raise ValueError(f"mean and std need 3 values (R, G, B), not {mean!r} and {std!r}")
            if not self.dtype.is_floating_point:
                raise ValueError(f"normalised images need a floating dtype, not {self.dtype}")
        else:
            self.mean = self.scale = None
        self.channels_last = bool(channels_last)
        self.depth = depth

    def __len__(self):
        return len(self.loader)

    def __iter__(self):
        import torch

        batches = iter(self.loader)  # held here: it holds the loader (NOTE [shutdown order] in loader.py)
        epoch = batches.delivery
        stats = epoch.stats
        pinned = _register(epoch.resources)
        side = torch.cuda.Stream(self.device)
        staging = [None] * self.depth if not pinned else None
        inflight, unreleased = collections.deque(), collections.deque()
        issued, ahead = 0, 1  # batches in flight before one is handed out: one, for the epoch's first
        try:
            while True:
                # The epoch's first batch goes out as soon as it is copied: waiting for the next
                # one too would add a batch interval to the start; the later ones have the next
                # ones' copies under way.
                while len(inflight) < ahead:
                    start = perf_counter_ns()
                    self._release(epoch, unreleased)
                    stats.add_transfer(perf_counter_ns() - start)
                    try:
                        message = epoch.next_message()
                    except StopIteration:
                        break
                    start = perf_counter_ns()
                    inflight.append(self._copy(epoch, message, side, staging, issued % self.depth))
                    stats.add_transfer(perf_counter_ns() - start)
                    issued += 1
                    if staging is not None:
                        epoch.release(message)
                    else:
                        unreleased.append(inflight[-1][:2])
                if not inflight:
                    return
                start = perf_counter_ns()
                message, event, batch = inflight.popleft()
                current = torch.cuda.current_stream(self.device)
                current.wait_event(event)
                for tensor in _tensors(batch):
                    tensor.record_stream(current)
                epoch.hand(message)
                batch = self._finish(batch)
                stats.add_transfer(perf_counter_ns() - start)
                stats.handed()
                ahead = self.depth
                yield batch
                stats.returned()
        finally:
            for message, event in unreleased:
                event.synchronize()
                epoch.release(message)

    def _release(self, epoch, unreleased):
        """Give back the slots whose copies are done; and wait for the copies of the next worker's
        slots if it has none left, or it could never deliver the batch the loader waits for."""
        while unreleased and unreleased[0][1].query():
            epoch.release(unreleased.popleft()[0])
        worker = epoch.next_worker()
        mine = [entry for entry in unreleased if entry[0].worker == worker]
        while worker is not None and len(mine) >= self.loader.options.prefetch:
            message, event = mine.pop(0)
            event.synchronize()
            unreleased.remove((message, event))
            epoch.release(message)

    def _copy(self, epoch, message, side, staging, index):
        """Start copying the slot of ``message`` to the device; ``(message, event, batch)``."""
        import torch

        cpu = epoch.slots.batch(message)
        with torch.cuda.stream(side):
            if staging is not None:
                previous = staging[index]
                tensors = _tensors(cpu)
                if previous is not None and [b.shape for b in previous[1]] == [t.shape for t in tensors]:
                    previous[0].synchronize()
                    buffers = [b.copy_(t) for b, t in zip(previous[1], tensors)]
                else:
                    buffers = [torch.empty_like(t, pin_memory=True).copy_(t) for t in tensors]
                source = _rebuild(cpu, buffers)
            else:
                source = cpu
            moved = [t.to(self.device, non_blocking=True) for t in _tensors(source)]
            event = torch.cuda.Event()
            event.record(side)
            if staging is not None:
                staging[index] = (event, buffers)
        return message, event, _rebuild(source, moved)

    def _finish(self, batch):
        """NCHW, normalised and converted on the consumer's stream."""
        import torch

        images = batch.images
        if not self.loader.options.channels_first:
            images = images.permute(0, 3, 1, 2)  # NHWC bytes seen as NCHW: channels_last
        if self.mean is not None:
            images = (images.to(self.dtype) - self.mean.to(self.dtype)) * self.scale.to(self.dtype)
        elif self.dtype is not None:
            images = images.to(self.dtype)
        if self.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        else:
            images = images.contiguous()
        return type(batch)(images, batch.labels, batch.keys, batch.fields, batch.epoch)


def _tensors(batch):
    """The batch's tensors in a fixed order: images, labels (if any), declared fields."""
    tensors = [batch.images]
    if batch.labels is not None:
        tensors.append(batch.labels)
    tensors.extend(batch.fields[name] for name in sorted(batch.fields))
    return tensors


def _rebuild(batch, tensors):
    """A batch like ``batch`` holding ``tensors`` (in ``_tensors`` order)."""
    tensors = list(tensors)
    images = tensors.pop(0)
    labels = tensors.pop(0) if batch.labels is not None else None
    fields = dict(zip(sorted(batch.fields), tensors))
    return type(batch)(images, labels, batch.keys, fields, batch.epoch)
