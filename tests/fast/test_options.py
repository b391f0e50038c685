"""FastLoader's arguments, checked once: LoaderOptions and DecodeOptions."""

import pickle

import pytest

from wdsmp.fast.options import DecodeOptions, LoaderOptions, positive_range, unit_fraction


def test_decode_options_normalise_and_pickle():
    options = DecodeOptions.of(train=1, scale=[1, 2], ratio=(0.5, 0.5), flip=1, resize_ratio=1, dct_scaling=0)
    assert options == DecodeOptions(True, (1.0, 2.0), (0.5, 0.5), 1.0, 1.0, False)
    assert isinstance(options.scale, tuple) and isinstance(options.flip, float)
    assert pickle.loads(pickle.dumps(options)) == options


@pytest.mark.parametrize("kw, match", [
    ({"scale": (0.5, 0.1)}, r"scale \(0.5, 0.1\) is not \(low, high\)"),
    ({"scale": 3}, "scale must be a pair of numbers"),
    ({"ratio": (0, 1)}, "ratio"),
    ({"flip": 1.5}, r"flip probability must be in \[0, 1\]"),
    ({"flip": "half"}, "flip probability"),
    ({"resize_ratio": 0}, r"resize_ratio must be in \(0, 1\]"),
    ({"resize_ratio": True}, "resize_ratio"),
])
def test_decode_options_refuse_bad_crops(kw, match):
    with pytest.raises(ValueError, match=match):
        DecodeOptions.of(**kw)


def test_checkers():
    assert positive_range((1, 2), "x") == (1.0, 2.0)
    assert unit_fraction(0, "p") == 0.0
    with pytest.raises(ValueError, match=r"p must be in \(0, 1\]"):
        unit_fraction(0, "p", zero=False)


def test_loader_options_fill_in_defaults():
    options = LoaderOptions.of(batch_size=8, train=False, num_workers=3, image_size=32, image_keys="jpg;png",
                               stages=[len], progress=True, rank=1, world_size=2)
    assert (options.num_workers, options.image_size, options.image_keys) == (3, (32, 32), ("jpg", "png"))
    assert options.stages == (len,) and options.progress == 10.0 and not options.train
    assert (options.shuffle, options.shuffle_buffer) == (False, 0)
    assert (options.rank, options.world_size) == (1, 2)
    shuffled = LoaderOptions.of(batch_size=8)
    assert shuffled.train and shuffled.shuffle and shuffled.shuffle_buffer == 256
    assert shuffled.progress is None and shuffled.num_workers >= 1


@pytest.mark.parametrize("kw, match", [
    ({"batch_size": 0}, "batch_size must be a positive int"),
    ({"batch_size": True}, "batch_size must be a positive int"),
    ({"num_workers": 0}, "num_workers must be a positive int"),
    ({"prefetch": 1.0}, "prefetch must be a positive int"),
    ({"image_size": (8, 0)}, r"image_size must be a positive int or \(height, width\)"),
    ({"image_keys": ""}, "image_keys must name extensions"),
    ({"keys": True, "key_length": 0}, "key_length must be a positive int"),
    ({"stages": [3]}, "stages must be callables"),
    ({"handler": None}, "handler must be callable"),
    ({"label": ""}, "label must be an extension name"),
    ({"shuffle_buffer": -1}, "shuffle_buffer must be an int >= 0"),
    ({"timeout": 0}, "timeout must be None or a positive number"),
    ({"stall_timeout": -1}, "stall_timeout must be None or a positive number"),
    ({"stall_timeout": "60"}, "stall_timeout must be None or a positive number"),
    ({"progress": -1}, "progress must be a bool or seconds"),
])
def test_loader_options_refuse_bad_arguments(kw, match):
    with pytest.raises(ValueError, match=match):
        LoaderOptions.of(**kw)


def test_a_setting_fastloader_does_not_have_is_refused_with_the_nearest_name():
    with pytest.raises(TypeError, match="unexpected keyword argument 'batchsize' \\(did you mean 'batch_size'\\?\\)"):
        LoaderOptions.of(batchsize=8)
    with pytest.raises(TypeError, match="unexpected keyword argument 'colour'$"):
        LoaderOptions.of(colour="red")


def test_the_crop_settings_are_checked_by_the_decode_options_and_the_budget_resolved_once(monkeypatch):
    monkeypatch.setenv("WDSMP_MAX_IMAGE_PIXELS", "123456789")
    options = LoaderOptions.of(train=False, scale=[0.5, 1], flip=1, image_size=(32, 48))
    assert options.decode == DecodeOptions.of(False, (0.5, 1.0), flip=1.0, max_pixels=123456789)
    with pytest.raises(ValueError, match="flip probability"):
        LoaderOptions.of(flip=2)


def test_the_settings_are_defined_once():
    """FastLoader's keywords are the settings' fields: nothing else lists them."""
    import dataclasses
    import inspect

    from wdsmp import FastLoader

    parameters = inspect.signature(FastLoader.__init__).parameters
    assert list(parameters) == ["self", "urls", "batch_size", "index", "settings"]
    assert parameters["batch_size"].default == LoaderOptions.batch_size
    assert "batch_size" in {field.name for field in dataclasses.fields(LoaderOptions)}
