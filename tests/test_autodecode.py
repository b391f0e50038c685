"""Tests of wdsmp.autodecode: image specs against Pillow, basic types through wdsmp's
own writer, the unsafe-decoder policy, errors that name where, and webdataset's forms."""

import gzip
import io
import json
import pickle
import re
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import simplejpeg
import torch
from PIL import Image, UnidentifiedImageError

import wdsmp as wds
import wdsmp.autodecode as ad
from wdsmp.autodecode import (
    IMAGE_EXTENSIONS,
    Continue,
    Decoder,
    DecodingError,
    ImageHandler,
    basichandlers,
    call_extension_handler,
    gzfilter,
    handle_extension,
    imagehandler,
    torch_audio,
    torch_video,
)
from wdsmp.errors import DecodeError
from wdsmp.writer import TarWriter, default_handlers, encode_based_on_extension

# spec -> (array type, dtype, Pillow mode), written out here rather than read from the module.
SPECS = {
    "l8": ("numpy", np.uint8, "L"),
    "rgb8": ("numpy", np.uint8, "RGB"),
    "rgba8": ("numpy", np.uint8, "RGBA"),
    "l": ("numpy", np.float32, "L"),
    "rgb": ("numpy", np.float32, "RGB"),
    "rgba": ("numpy", np.float32, "RGBA"),
    "torchl8": ("torch", torch.uint8, "L"),
    "torchrgb8": ("torch", torch.uint8, "RGB"),
    "torchrgba8": ("torch", torch.uint8, "RGBA"),
    "torchl": ("torch", torch.float32, "L"),
    "torchrgb": ("torch", torch.float32, "RGB"),
    "torch": ("torch", torch.float32, "RGB"),
    "torchrgba": ("torch", torch.float32, "RGBA"),
    "pill": ("pil", None, "L"),
    "pil": ("pil", None, "RGB"),
    "pilrgb": ("pil", None, "RGB"),
    "pilrgba": ("pil", None, "RGBA"),
}
H, W = 30, 40


def pixels(channels=3, seed=0):
    """HxWxC uint8 gradients plus noise, so every decoder has real content to get right."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:H, 0:W]
    planes = [x * 6, y * 8, (x + y) * 3, 255 - x * 5][:channels]
    array = np.stack(planes, -1) + rng.integers(0, 40, (H, W, channels))
    return np.clip(array, 0, 255).astype(np.uint8)


def encode(image, fmt, **options):
    if isinstance(image, np.ndarray):
        image = Image.fromarray(image[:, :, 0] if image.shape[2] == 1 else image)
    stream = io.BytesIO()
    image.save(stream, format=fmt, **options)
    return stream.getvalue()


IMAGES = {
    "rgb.jpg": encode(pixels(3), "JPEG", quality=90),
    "gray.jpg": encode(pixels(1), "JPEG", quality=90),
    "rgb.png": encode(pixels(3), "PNG"),
    "rgba.png": encode(pixels(4), "PNG"),
    "gray.png": encode(pixels(1), "PNG"),
}
CMYK_JPEG = encode(Image.fromarray(pixels(3)).convert("CMYK"), "JPEG", quality=95)


def pillow(data, mode):
    return np.asarray(Image.open(io.BytesIO(data)).convert(mode), dtype=np.float64)


def as_hwc_255(value, spec):
    """The decoded value as a float64 HxW(xC) array in 0..255, after checking its type."""
    atype, dtype, mode = SPECS[spec]
    if atype == "pil":
        assert isinstance(value, Image.Image) and value.mode == mode
        return np.asarray(value, dtype=np.float64)
    if atype == "torch":
        assert isinstance(value, torch.Tensor) and value.dtype == dtype and value.is_contiguous()
        array = value.numpy()
        if array.ndim == 3:
            array = array.transpose(1, 2, 0)
    else:
        assert isinstance(value, np.ndarray) and value.dtype == dtype
        array = value
    if dtype in (np.float32, torch.float32):
        assert 0.0 <= array.min() and array.max() <= 1.0
        return array.astype(np.float64) * 255.0
    return array.astype(np.float64)


@pytest.mark.parametrize("source", sorted(IMAGES))
@pytest.mark.parametrize("spec", sorted(SPECS))
def test_every_spec_has_its_type_shape_and_pillows_pixels(spec, source):
    data = IMAGES[source]
    field = "img." + source.split(".")[1]
    value = Decoder([spec])({"__key__": "k", field: data})[field]
    mode = SPECS[spec][2]
    channels = {"L": (), "RGB": (3,), "RGBA": (4,)}[mode]
    shape = (H, W) + channels
    if SPECS[spec][0] == "torch":
        shape = channels + (H, W)
    assert (value.size == (W, H)) if SPECS[spec][0] == "pil" else (tuple(value.shape) == shape)
    got = as_hwc_255(value, spec)
    assert np.abs(got - pillow(data, mode)).mean() < 1.0


def test_float_specs_are_the_uint8_pixels_over_255():
    data = IMAGES["rgb.png"]
    u8 = imagehandler("rgb8")(".png", data)
    f32 = imagehandler("rgb")(".png", data)
    np.testing.assert_array_equal(f32, u8.astype(np.float32) / 255.0)


def test_jpeg_goes_through_simplejpeg_and_png_does_not(monkeypatch):
    calls = []
    real = simplejpeg.decode_jpeg

    def counting(data, *args, **kw):
        calls.append(len(data))
        return real(data, *args, **kw)

    monkeypatch.setattr(simplejpeg, "decode_jpeg", counting)
    imagehandler("rgb8")(".png", IMAGES["rgb.png"])
    assert calls == []
    imagehandler("rgb8")(".jpg", IMAGES["rgb.jpg"])
    assert calls == [len(IMAGES["rgb.jpg"])]


def test_a_jpeg_simplejpeg_refuses_is_decoded_by_pillow(monkeypatch):
    def refuse(*args, **kw):
        raise ValueError("simulated libjpeg-turbo failure")

    monkeypatch.setattr(simplejpeg, "decode_jpeg", refuse)
    for spec in ["rgb8", "l8", "pil"]:
        got = np.asarray(imagehandler(spec)(".jpg", IMAGES["rgb.jpg"]), dtype=np.float64)
        np.testing.assert_array_equal(got, pillow(IMAGES["rgb.jpg"], SPECS[spec][2]))


@pytest.mark.parametrize("spec", ["rgb8", "l8", "rgba8", "pil"])
def test_cmyk_jpeg_is_decoded_as_pillow_does(spec):
    # libjpeg-turbo converts CMYK to RGB by a formula a unit off Pillow's: Pillow must decode it.
    got = np.asarray(imagehandler(spec)(".jpg", CMYK_JPEG), dtype=np.float64)
    np.testing.assert_array_equal(got, pillow(CMYK_JPEG, SPECS[spec][2]))


def test_torch_and_numpy_results_are_writable(monkeypatch):
    wrap = torch.from_numpy

    def checked(array):  # torch would share a read-only buffer (and warn, once a process)
        assert array.flags.writeable
        return wrap(array)

    monkeypatch.setattr(torch, "from_numpy", checked)
    for spec in ["torchrgb8", "torchl8", "torchl", "torch"]:
        for source in ["rgb.png", "gray.png", "rgb.jpg"]:
            imagehandler(spec)("." + source, IMAGES[source]).add_(1)
    for spec in ["rgb", "l"]:
        imagehandler(spec)(".jpg", IMAGES["rgb.jpg"])[0, 0] = 0.5


@pytest.mark.parametrize("fmt,ext", [("GIF", "gif"), ("BMP", "bmp"), ("WEBP", "webp"), ("TIFF", "tif"),
                                     ("TIFF", "tiff"), ("PPM", "ppm"), ("JPEG", "jpeg"), ("PNG", "PNG")])
def test_other_image_formats_and_uppercase_extensions(fmt, ext):
    data = encode(pixels(3), fmt, **({"lossless": True} if fmt == "WEBP" else {}))
    value = Decoder(["rgb8"])({"__key__": "k", "a.b." + ext: data})["a.b." + ext]
    assert value.shape == (H, W, 3)
    assert np.abs(value.astype(np.float64) - pillow(data, "RGB")).mean() < 1.0


def test_image_extensions_cover_the_common_formats():
    assert set("jpg jpeg png ppm pgm pbm pnm gif tif tiff bmp webp".split()) <= set(IMAGE_EXTENSIONS)


def test_image_handler_leaves_other_fields_and_honours_its_extensions():
    handler = ImageHandler("rgb8", extensions="png")
    assert handler(".jpg", IMAGES["rgb.jpg"]) is None
    assert handler(".foo.PNG", IMAGES["rgb.png"]).shape == (H, W, 3)
    assert imagehandler("rgb8")(".txt", b"not an image") is None


def test_image_specs_are_case_insensitive_and_unknown_ones_are_refused():
    assert isinstance(imagehandler("PIL")(".png", IMAGES["rgb.png"]), Image.Image)
    with pytest.raises(ValueError, match=r"unknown image spec 'rgb16'.*rgb8"):
        imagehandler("rgb16")
    with pytest.raises(ValueError, match="unknown image spec"):
        Decoder(["nonsense"])


# Basic types, encoded by wdsmp's writer.

BASIC = {
    "cls": 7, "cls2": 3, "index": 11, "inx": 12, "id": 13,
    "txt": "text ✓", "text": "more text", "transcript": "said",
    "json": {"a": [1, 2.5, None]}, "jsn": [1, "x"],
    "mp": {"m": [1, 2]}, "msg": [b"raw", "str"], "msgpack": {"k": 1},
    "cbor": {"c": [1, 2, {"d": b"bytes"}]},
    "txt.gz": "zipped text", "json.gz": {"zipped": True}, "seg.cls": 5,
}


def test_basic_types_round_trip_through_the_writers_encoders():
    sample = {"__key__": "k", **BASIC, "npy": np.arange(12, dtype=np.int16).reshape(3, 4),
              "npz": {"a": np.ones(3), "b": np.arange(4)},
              "ten": [np.eye(2, dtype=np.float32), np.arange(3)]}
    encoded = encode_based_on_extension(sample, default_handlers)
    assert all(isinstance(encoded[k], bytes) for k in sample if k != "__key__")
    decoded = Decoder([])(encoded)
    for field, value in BASIC.items():
        assert decoded[field] == value, field
    np.testing.assert_array_equal(decoded["npy"], sample["npy"])
    assert decoded["npy"].dtype == np.int16
    assert set(decoded["npz"]) == {"a", "b"}
    np.testing.assert_array_equal(decoded["npz"]["b"], np.arange(4))
    assert len(decoded["ten"]) == 2 and decoded["ten"][0].dtype == np.float32
    np.testing.assert_array_equal(decoded["ten"][1], np.arange(3))


def test_decoding_a_shard_written_by_tarwriter(tmp_path):
    path = str(tmp_path / "s.tar")
    with TarWriter(path) as sink:
        for i in range(3):
            sink.write({"__key__": f"s{i}", "cls": i, "jpg": pixels(3, seed=i), "json.gz": {"i": i}})
    samples = [Decoder(["rgb8"])(s) for s in wds.tarfile_samples([{"url": path}])]
    got = [(s["__key__"], s["cls"], s["json.gz"]) for s in samples]
    assert got == [(f"s{i}", i, {"i": i}) for i in range(3)]
    assert all(s["jpg"].shape == (H, W, 3) and s["jpg"].dtype == np.uint8 for s in samples)
    assert np.abs(samples[1]["jpg"].astype(float) - pixels(3, seed=1)).mean() < 8  # JPEG quality 100


def test_basichandlers_dispatch_on_the_last_extension_and_read_the_table(monkeypatch):
    assert basichandlers(".a.b.cls", b"42") == 42
    assert basichandlers(".bin", b"\x00") is None
    assert basichandlers(".CLS", b"1") is None  # case as written, as webdataset
    monkeypatch.setitem(ad.decoders, "upper", bytes.upper)
    assert Decoder([])({"__key__": "k", "x.upper": b"abc"})["x.upper"] == b"ABC"


def test_gz_fields_are_unpacked_then_dispatched_again():
    packed = gzip.compress(b"hello")
    assert gzfilter(".txt", b"x") is None
    result = gzfilter(".x.txt.GZ", packed)
    assert isinstance(result, Continue) and (result.key, result.data) == (".x.txt", b"hello")
    decoded = Decoder([])({"__key__": "k", "txt.gz": packed, "bin.gz": packed, "cls.gz": gzip.compress(b"4")})
    assert decoded == {"__key__": "k", "txt.gz": "hello", "bin.gz": b"hello", "cls.gz": 4}


def test_a_handler_returning_continue_hands_on_the_new_name_and_bytes():
    def rename(key, data):
        return Continue(".cls", data.strip(b"<>")) if key == ".wrapped" else None

    assert Decoder([rename])({"__key__": "k", "wrapped": b"<9>"})["wrapped"] == 9


# Unsafe decoders: NOTE [unsafe decoders].

class Opaque:
    """A class torch's weights-only loader will not build."""

    def __init__(self, value):
        self.value = value


@pytest.mark.parametrize("field", ["pyd", "pickle", "pkl", "x.pyd"])
def test_pickles_are_refused_unless_the_decoder_is_unsafe(field):
    sample = {"__key__": "k", "__url__": "s.tar", field: pickle.dumps({"a": 1})}
    with pytest.raises(DecodingError, match=r"refusing to unpickle.*unsafe=True.*member 'k\." + field):
        Decoder([])(sample)
    with pytest.raises(DecodeError, match="unsafe=True"):
        basichandlers("." + field, sample[field])
    assert Decoder([], unsafe=True)(sample)[field] == {"a": 1}


def test_unsafe_applies_to_basichandlers_given_explicitly():
    sample = {"__key__": "k", "pyd": pickle.dumps(3)}
    assert Decoder([], post=[basichandlers], unsafe=True)(sample)["pyd"] == 3
    with pytest.raises(DecodingError, match="refusing to unpickle"):
        Decoder([], post=[basichandlers])(sample)


def pth_bytes(value):
    stream = io.BytesIO()
    torch.save(value, stream)
    return stream.getvalue()


def test_pth_loads_weights_only_unless_unsafe():
    tensors = {"w": torch.arange(4.0)}
    assert torch.equal(Decoder([])({"__key__": "k", "pth": pth_bytes(tensors)})["pth"]["w"], tensors["w"])
    opaque = {"__key__": "k", "pth": pth_bytes(Opaque(5))}
    with pytest.raises(DecodingError, match=r"member 'k\.pth'") as info:
        Decoder([])(opaque)
    assert isinstance(info.value.__cause__, pickle.UnpicklingError)
    assert Decoder([], unsafe=True)(opaque)["pth"].value == 5


def test_wds_secure_refuses_pickles_and_pth_even_when_unsafe(monkeypatch):
    monkeypatch.setenv("WDS_SECURE", "1")
    for field, data in [("pyd", pickle.dumps(1)), ("pth", pth_bytes(torch.zeros(2)))]:
        for unsafe in [False, True]:
            with pytest.raises(DecodingError, match=f"WDS_SECURE=1 forbids.*member 'k.{field}'"):
                Decoder([], unsafe=unsafe)({"__key__": "k", field: data})
    monkeypatch.setenv("WDS_SECURE", "0")
    assert Decoder([], unsafe=True)({"__key__": "k", "pyd": pickle.dumps(1)})["pyd"] == 1


# Video and audio without torchvision / torchaudio.

@pytest.mark.parametrize("handler,package,field", [(torch_video, "torchvision", "mp4"),
                                                   (torch_audio, "torchaudio", "flac")])
def test_missing_video_and_audio_packages_are_named(monkeypatch, handler, package, field):
    monkeypatch.setitem(sys.modules, package, None)  # as if not installed, whatever is
    monkeypatch.setitem(sys.modules, package + ".io", None)
    assert handler(".txt", b"x") is None
    message = f"needs {package}, which is not installed.*member 'k.{field}'"
    with pytest.raises(DecodingError, match=message) as info:
        Decoder([handler])({"__key__": "k", "__url__": "s.tar", field: b"\0" * 8})
    assert isinstance(info.value.__cause__, DecodeError)
    assert isinstance(info.value.__cause__.__cause__, ImportError)


# Errors and the shape of samples.

def test_errors_name_shard_key_and_field_and_chain_the_cause():
    sample = {"__key__": "dir/k7", "__url__": "data/s-0001.tar", "cls": b"not a number"}
    where = r"ValueError: .*shard 'data/s-0001\.tar', member 'dir/k7\.cls'"
    with pytest.raises(DecodingError, match=where) as info:
        Decoder([])(sample)
    error = info.value
    assert isinstance(error, DecodeError) and isinstance(error, ValueError)
    assert (error.url, error.key, error.k, error.sample) == ("data/s-0001.tar", "dir/k7", "cls", sample)
    assert isinstance(error.__cause__, ValueError)
    copy = pickle.loads(pickle.dumps(error))
    assert (type(copy), str(copy)) == (DecodingError, str(error))
    assert (copy.url, copy.key, copy.k) == ("data/s-0001.tar", "dir/k7", "cls")


def test_a_broken_image_names_its_field():
    with pytest.raises(DecodingError, match=r"cannot decode: UnidentifiedImageError.*member 'k\.jpg'"):
        Decoder(["rgb"])({"__key__": "k", "__url__": "s.tar", "jpg": b"\xff\xd8\xff garbage"})


@pytest.mark.parametrize("data", [bytes(1000), b"\xff\xd8\xff" + bytes(997)], ids=["zeros", "jpeg-magic-then-zeros"])
def test_a_zeroed_jpeg_names_its_field(data):
    sample = {"__key__": "k", "jpg": data}
    where = r"cannot decode: UnidentifiedImageError: .*\(shard <stream>, member 'k\.jpg'\)$"
    with pytest.raises(DecodingError, match=where) as info:
        Decoder(["rgb"])(sample)
    assert (info.value.url, info.value.key, info.value.k) == (None, "k", "jpg")
    assert isinstance(info.value.__cause__, UnidentifiedImageError)
    with pytest.raises(DecodingError, match=where):  # the same through the pipeline stage
        list(wds.decode("rgb")([sample]))


def jpeg_claiming(height, width):
    """A small real JPEG whose baseline frame header (SOF0) claims another size."""
    data = encode(pixels(3), "JPEG", quality=90)
    at = data.index(b"\xff\xc0")
    return data[:at + 5] + struct.pack(">HH", height, width) + data[at + 9:]


# Decodes the JPEG on stdin with wds.decode(spec), allowed at most 1 GiB of address space more
# than the interpreter has once its imports are done, and reports what was raised as JSON.
_DECODE_UNDER_A_MEMORY_CAP = textwrap.dedent("""
    import json, resource, sys, time
    import numpy, PIL.Image, simplejpeg
    import wdsmp
    data = sys.stdin.buffer.read()
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    cap = mapped + (1 << 30)
    resource.setrlimit(resource.RLIMIT_AS, (cap if hard == resource.RLIM_INFINITY else min(cap, hard), hard))
    start = time.perf_counter()
    try:
        list(wdsmp.decode(sys.argv[1])([{"__key__": "k", "jpg": data}]))
        error, causes = None, []
    except Exception as exn:
        error, causes, cause = exn, [], exn.__cause__
        while cause is not None:
            causes.append(type(cause).__name__)
            cause = cause.__cause__
    print(json.dumps({"seconds": time.perf_counter() - start, "causes": causes,
                      "error": None if error is None else [type(error).__name__, str(error)]}))
""")


@pytest.mark.parametrize("spec", ["rgb", "pil"])
def test_an_oversized_jpeg_header_is_refused_before_allocating(spec):
    """A header claiming 60000x60000 (10 GiB of RGB) is a DecodeError at once; the decoder runs
    in a child allowed only 1 GiB more, so an attempt to allocate the image is a MemoryError."""
    child = subprocess.run([sys.executable, "-c", _DECODE_UNDER_A_MEMORY_CAP, spec], input=jpeg_claiming(60000, 60000),
                           capture_output=True, timeout=60)
    assert child.returncode == 0, child.stderr.decode(errors="replace")
    report = json.loads(child.stdout)
    assert report["error"] is not None, "the oversized image was decoded"
    name, message = report["error"]
    assert name == "DecodingError" and "MemoryError" not in report["causes"], message
    assert re.search(r"the JPEG image is 60000x60000 pixels, outside the limits .*member 'k\.jpg'", message), message
    assert report["seconds"] < 1.0


def test_non_bytes_fields_are_errors_unless_partial():
    sample = {"__key__": "k", "cls": 3, "txt": b"t"}
    with pytest.raises(DecodingError, match=r"holds int, not bytes.*partial=True.*member 'k\.cls'"):
        Decoder([])(sample)
    assert Decoder([], partial=True)(sample) == {"__key__": "k", "cls": 3, "txt": "t"}


def test_fields_no_handler_takes_stay_bytes():
    sample = {"__key__": "k", "bin": b"\x00\x01", "weird.ext": b"x"}
    assert Decoder([])(sample) == sample
    assert Decoder([], partial=True)(sample) == sample


def test_only_limits_the_fields_decoded():
    sample = {"__key__": "k", "cls": b"1", "txt": b"t", "json": b"[]"}
    assert Decoder([], only="cls json")(sample) == {"__key__": "k", "cls": 1, "txt": b"t", "json": []}
    assert Decoder([], only=["txt"])(sample) == {"__key__": "k", "cls": b"1", "txt": "t", "json": b"[]"}


def test_metadata_keys_pass_without_handlers():
    def refuse_all(key, data):
        raise AssertionError(f"handler called for {key}")

    sample = {"__key__": "k", "__url__": "u", "__meta__": b"text", "__raw__": b"\xff\xfe"}
    result = Decoder([refuse_all], pre=[], post=[])(sample)
    assert result == {"__key__": "k", "__url__": "u", "__meta__": "text", "__raw__": b"\xff\xfe"}
    assert result is not sample


# Constructing decoders, webdataset's forms included.

def png_shape(key, data):
    """A handler for the tests: the shape of a .png, with Pillow."""
    return np.asarray(Image.open(io.BytesIO(data))).shape if key.endswith(".png") else None


def dataset():
    return [{"__key__": f"s{i}", "__url__": "mem", "input.png": IMAGES["rgb.png"], "cls": str(i).encode()}
            for i in range(3)]


def test_decoder_called_on_a_dataset_gives_a_reiterable_dataset():
    decoded = Decoder(png_shape, torch_video, torch_audio)(dataset())
    for _ in range(2):
        samples = list(decoded)
        assert [(s["__key__"], s["cls"], s["input.png"]) for s in samples] == [
            (f"s{i}", i, (H, W, 3)) for i in range(3)]
    again = pickle.loads(pickle.dumps(decoded))  # spawned DataLoader workers get a copy
    assert [s["cls"] for s in again] == [0, 1, 2]


def test_handlers_as_a_list_or_as_arguments_are_the_same():
    sample = dataset()[0]
    assert Decoder([png_shape, "rgb8"])(sample) == Decoder(png_shape, "rgb8")(sample) \
        == Decoder(handlers=[png_shape, "rgb8"])(sample)
    assert Decoder(png_shape, "rgb8")(sample)["input.png"] == (H, W, 3)  # order kept: png_shape first
    assert Decoder("rgb8", png_shape)(sample)["input.png"].shape == (H, W, 3)


def test_webdatasets_positional_pre_post_only_partial():
    sample = {"__key__": "k", "cls": b"1", "txt.gz": gzip.compress(b"t"), "n": 5}
    assert Decoder([], [], [basichandlers], ["cls"], True)(sample) == {**sample, "cls": 1}
    assert Decoder([], None, [])(sample.copy() | {"n": b"5"}) == {**sample, "txt.gz": b"t", "n": b"5"}
    with pytest.raises(TypeError, match="at most 5 positional"):
        Decoder([], [], [], None, False, "extra")
    with pytest.raises(TypeError, match="not both"):
        Decoder(png_shape, handlers=[png_shape])
    with pytest.raises(TypeError, match="unexpected keyword arguments \\['hanlders'\\]"):
        Decoder(hanlders=[png_shape])


def test_bad_handlers_and_bad_arguments_are_refused():
    with pytest.raises(TypeError, match="must be callable or an image spec"):
        Decoder([42])
    with pytest.raises(TypeError, match="must be callable or an image spec"):
        Decoder(png_shape, [png_shape])
    with pytest.raises(TypeError, match="not int"):
        Decoder([])(42)


def test_decoders_pickle():
    handlers = ["torchrgb", handle_extension("png", len), png_shape]
    decoder = Decoder(handlers, only="input.png cls", unsafe=True)
    copy = pickle.loads(pickle.dumps(decoder))
    sample = dataset()[1]
    assert copy(sample)["input.png"].shape == decoder(sample)["input.png"].shape == (3, H, W)
    assert copy.unsafe and copy.only == {"input.png", "cls"}
    assert pickle.loads(pickle.dumps(ad.default_decoder))(sample)["cls"] == 1


# Matching by extension.

@pytest.mark.parametrize("extensions,field,matches", [
    ("jpg jpeg", "jpg", True),
    ("jpg jpeg", "x.JPEG", True),
    ("jpg jpeg", "jpg.txt", False),
    ("seg.png", "seg.png", True),
    ("seg.png", "a.SEG.png", True),
    ("seg.png", "png", False),
    ("seg.png", "xseg.png", False),
    ("seg.png", "a.png", False),
    (".png", "input.png", True),  # the documented example: a leading dot is ignored
    ("png", "xpng", False),
    (["gif", "png"], "a.png", True),
])
def test_handle_extension_matching(extensions, field, matches):
    expected = ("got", b"d") if matches else None
    handler = handle_extension(extensions, lambda data: ("got", data))
    assert handler("." + field, b"d") == expected
    assert call_extension_handler("." + field, b"d", lambda data: ("got", data), extensions) == expected


def test_handle_extension_in_a_decoder_and_pickled():
    decoder = Decoder(handle_extension("cls", bytes.upper))
    assert decoder({"__key__": "k", "a.cls": b"x"})["a.cls"] == b"X"
    handler = pickle.loads(pickle.dumps(handle_extension("seg.png jpg", len)))
    assert (handler(".a.seg.png", b"abc"), handler(".png", b"abc")) == (3, None)


# Decompression bombs: what one field may cost is bounded.


def test_a_gz_field_bomb_is_refused_under_a_memory_limit(tmp_path):
    from tests.bombs import gzip_of_zeros, run_limited

    (tmp_path / "bomb.gz").write_bytes(gzip_of_zeros(b"", 96 << 24))  # 1.5 GiB from 1.5 MB
    status, out = run_limited(f"""
        import os
        os.environ["WDSMP_MAX_MEMBER_SIZE"] = str(256 << 20)  # the default, 1 GiB, is more than the limit here
        from wdsmp.autodecode import Decoder
        sample = {{"__key__": "k", "__url__": "s.tar", "txt.gz": open({str(tmp_path / "bomb.gz")!r}, "rb").read()}}
        try:
            Decoder([])(sample)
        except Exception as exn:
            print(type(exn).__name__, exn)
        """)
    assert status == 0, out
    assert re.search(r"DecodingError cannot decode: the .gz field expands to more than 268435456 bytes "
                     r"\(max_field_size, or WDSMP_MAX_MEMBER_SIZE\).*shard 's.tar', member 'k.txt.gz'", out), out


def test_gz_fields_are_read_as_gzip_reads_them_up_to_the_cap(monkeypatch):
    packed = gzip.compress(b"one ") + b"\0\0" + gzip.compress(b"two")  # two members, zero padding between
    assert ad.gunzip(packed, 7) == gzip.decompress(packed) == b"one two"
    with pytest.raises(DecodeError, match="expands to more than 6 bytes"):
        ad.gunzip(packed, 6)
    with pytest.raises(EOFError):
        ad.gunzip(packed[:-3], 100)
    sample = {"__key__": "k", "txt.gz": gzip.compress(b"x" * 100)}
    assert Decoder([])(sample)["txt.gz"] == "x" * 100
    with pytest.raises(ad.DecodingError, match="expands to more than 99 bytes"):
        Decoder([], max_field_size=99)(sample)
    monkeypatch.setenv("WDSMP_MAX_MEMBER_SIZE", "99")
    with pytest.raises(ad.DecodingError, match="expands to more than 99 bytes"):
        Decoder([])(sample)
    with pytest.raises(ValueError, match="max_field_size must be a positive"):
        Decoder([], max_field_size=-1)


def test_image_bombs_are_refused_by_the_pixel_budget_under_a_memory_limit(tmp_path):
    """A PNG (168 kB) and a WebP (28 bytes) claiming 13000 x 13000 pixels, under the size
    limits: 2 GB as float RGB, refused by the per-image budget before decoding."""
    from tests.bombs import png_of_zeros, run_limited, webp_of_zeros

    (tmp_path / "bomb.png").write_bytes(png_of_zeros(13000, 13000))
    (tmp_path / "bomb.webp").write_bytes(webp_of_zeros(13000, 13000))
    status, out = run_limited(f"""
        from wdsmp.autodecode import Decoder
        for ext in ["png", "webp"]:
            data = open(f"{tmp_path}/bomb.{{ext}}", "rb").read()
            try:
                Decoder(["rgb"])({{"__key__": "k", "__url__": "s.tar", ext: data}})
            except Exception as exn:
                print(type(exn).__name__, exn)
        """)
    assert status == 0, out
    for fmt, ext in (("PNG", "png"), ("WEBP", "webp")):
        assert re.search(rf"DecodingError cannot decode: ImageTooLarge: the {fmt} image decodes to 13000x13000 = "
                         rf"169000000 pixels, "
                         rf"more than the budget of 67108864 pixels per image \(max_image_pixels, or "
                         rf"WDSMP_MAX_IMAGE_PIXELS\).*member 'k.{ext}'", out), out


@pytest.mark.parametrize("spec", ["pil", "pill", "pilrgba", "l8", "rgb8", "rgba", "torchrgb", "torchl8"])
def test_every_image_spec_holds_a_jpeg_to_the_pixel_budget(spec):
    """Each spec's JPEG path (libjpeg-turbo into a Pillow image or an array) checks the budget
    from the header before decoding, as Pillow's path does."""
    sample = {"__key__": "k", "jpg": simplejpeg.encode_jpeg(np.zeros((200, 300, 3), np.uint8))}
    with pytest.raises(ad.DecodingError, match="the JPEG image decodes to 300x200 = 60000 pixels, more than "
                                               "the budget of 59999"):
        Decoder([spec], max_image_pixels=59999)(sample)
    assert Decoder([spec], max_image_pixels=60000)(sample)["jpg"] is not None


def test_the_pixel_budget_is_settable(monkeypatch):
    from tests.bombs import png_of_zeros

    sample = {"__key__": "k", "png": png_of_zeros(300, 200), "jpg": simplejpeg.encode_jpeg(
        np.zeros((200, 300, 3), np.uint8))}
    assert Decoder(["rgb8"])(sample)["png"].shape == (200, 300, 3)
    for ext, fmt in (("png", "PNG"), ("jpg", "JPEG")):
        with pytest.raises(ad.DecodingError, match=f"the {fmt} image decodes to 300x200 = 60000 pixels, more "
                                                   f"than the budget of 59999"):
            Decoder(["rgb8"], max_image_pixels=59999, only=[ext])(sample)
    monkeypatch.setenv("WDSMP_MAX_IMAGE_PIXELS", "59999")
    with pytest.raises(ad.DecodingError, match="budget of 59999"):
        Decoder([ad.ImageHandler("pil")])(sample)
    assert Decoder([ad.ImageHandler("pil", max_pixels=60000)])(sample)["png"].size == (300, 200)
