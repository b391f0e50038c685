"""Samples from files of concatenated CBOR or MsgPack items, one sample per item.

For collections of very many small samples (tuples, short strings) a tar
archive spends a 512-byte header per member; a ``.cbors`` file (CBOR items
written one after another, e.g. with ``cbor2.dump`` in a loop) or a MsgPack
stream stores them back to back instead. ``cbors_to_samples()`` and
``msgpack_to_samples()`` take shard URLs like ``tarfile_to_samples()`` and
yield each item exactly as decoded: a CBOR array or a written tuple comes out
as a list (``[-5.0, '-5.0']``), a map as a dict. Nothing is added to the items
(no ``__key__`` or ``__url__``), as in webdataset.

Both read a shard in chunks and decode from memory, so a shard is streamed
(never read whole) while the decoders run at their in-memory speed. An item
that breaks off at the end of the file, or bytes that are not CBOR/MsgPack,
raise ``DecodeError`` naming the shard, the item's index and its byte offset;
``handler=`` decides whether to raise it, skip the rest of that shard, or stop.
"""

import io
from typing import IO, Any, Callable, Dict, Iterable, Iterator, Mapping, Optional, Union

from ..stages.base import handle_each
from ..errors import DecodeError
from ..filters import pipelinefilter
from ..handlers import _Handler, reraise_exception
from ..tariterators import url_opener

__all__ = [
    "cbor_iterator",
    "cbor2_iterator",
    "cbors_samples",
    "cbors2_samples",
    "cbors_to_samples",
    "cbors2_to_samples",
    "msgpack_iterator",
    "msgpack_samples",
    "msgpack_to_samples",
]

_CHUNK = 1 << 20  # bytes read from a shard at a time


def _truncated(kind: str, index: int, url: Optional[str], offset: int) -> DecodeError:
    return DecodeError(f"truncated {kind} stream: the file ends inside item {index}", url,
                       offset=offset)


def _cbor_items(stream: IO[bytes], url: Optional[str], chunksize: int = _CHUNK) -> Iterator[Any]:
    """The items of one CBOR stream.

    NOTE [partial item]: an item may straddle a chunk boundary. Its decode then
    fails with an end-of-data error and is retried from its first byte once
    more data is in memory; the read size grows with the carried-over bytes,
    so an item larger than a chunk costs amortised linear time. Only at end
    of file does a partial item mean the shard is truncated.
    """
    import cbor2

    buf = b""
    base = 0  # offset in the shard of buf[0]
    index = 0
    ended = False
    while True:
        view = io.BytesIO(buf)
        decoder = cbor2.CBORDecoder(view)
        pos = 0
        while pos < len(buf):
            try:
                item = decoder.decode()
            except cbor2.CBORDecodeEOF:
                break  # NOTE [partial item]
            except cbor2.CBORDecodeError as exn:
                raise DecodeError(f"corrupt CBOR item {index}: {exn}", url,
                                  offset=base + pos) from exn
            pos = view.tell()
            index += 1
            yield item
        if ended:
            if pos < len(buf):
                raise _truncated("CBOR", index, url, base + pos)
            return
        base += pos
        buf = buf[pos:]
        more = stream.read(max(chunksize, len(buf)))
        ended = not more
        buf += more


def _msgpack_items(stream: IO[bytes], url: Optional[str], chunksize: int = _CHUNK) -> Iterator[Any]:
    """The items of one MsgPack stream, fed to a ``msgpack.Unpacker`` chunk by chunk.

    The unpacker keeps a partial item between feeds by itself; an item starts
    where the previous one ended, and bytes fed beyond the last complete item
    at end of file are a truncated one.
    """
    import msgpack

    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=0)
    fed = 0
    end = 0  # offset just past the last complete item
    index = 0
    while True:
        chunk = stream.read(chunksize)
        if not chunk:
            break
        unpacker.feed(chunk)
        fed += len(chunk)
        while True:
            try:
                item = unpacker.unpack()
            except msgpack.OutOfData:
                break
            except (ValueError, TypeError) as exn:  # FormatError, StackError, unhashable keys
                detail = str(exn) or type(exn).__name__  # msgpack's FormatError has no text
                raise DecodeError(f"corrupt MsgPack item {index}: {detail}", url,
                                  offset=end) from exn
            end = unpacker.tell()
            index += 1
            yield item
    if fed > end:
        raise _truncated("MsgPack", index, url, end)


def _items_of_shards(data: Iterable[Dict[str, Any]], items: Callable[[IO[bytes], Optional[str]], Iterator[Any]],
                     handler: _Handler) -> Iterator[Any]:
    """Items of each opened shard in ``data``; a failing shard goes to ``handler``."""

    def shard_items(source: Dict[str, Any]) -> Iterator[Any]:
        stream = source["stream"]
        try:
            yield from items(stream, source.get("url"))
        finally:
            stream.close()

    return handle_each(data, shard_items, handler)


def cbor_iterator(data: Iterable[Dict[str, Any]], handler: _Handler = reraise_exception) -> Iterator[Any]:
    """Items of opened CBOR shards (``{"url", "stream"}`` dicts, as ``url_opener`` makes)."""
    return _items_of_shards(data, _cbor_items, handler)


def msgpack_iterator(data: Iterable[Dict[str, Any]], handler: _Handler = reraise_exception) -> Iterator[Any]:
    """Items of opened MsgPack shards (``{"url", "stream"}`` dicts, as ``url_opener`` makes)."""
    return _items_of_shards(data, _msgpack_items, handler)


def cbors_samples(src: Iterable[Union[str, Mapping[str, Any]]], handler: _Handler = reraise_exception) -> Iterator[Any]:
    """Shard URLs (``{"url": ...}`` dicts or strings) of CBOR files to their items."""
    return cbor_iterator(url_opener(src, handler=handler), handler=handler)


def msgpack_samples(src: Iterable[Union[str, Mapping[str, Any]]],
                    handler: _Handler = reraise_exception) -> Iterator[Any]:
    """Shard URLs (``{"url": ...}`` dicts or strings) of MsgPack files to their items."""
    return msgpack_iterator(url_opener(src, handler=handler), handler=handler)


cbors_to_samples = pipelinefilter(cbors_samples)
msgpack_to_samples = pipelinefilter(msgpack_samples)

# webdataset had a second set of names for decoding with cbor2; wdsmp always does.
cbor2_iterator = cbor_iterator
cbors2_samples = cbors_samples
cbors2_to_samples = cbors_to_samples
