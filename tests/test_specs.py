"""Dataset specs: loading YAML/JSON, validation errors, weights, and the mixed dataset."""

import json
import pickle
from collections import Counter
from itertools import islice

import pytest
from torch.utils.data import DataLoader

import wdsmp as wds
from wdsmp.datasets.specs import CollectionSpec, DatasetSpec, SpecError, SpecMix, load_spec, spec_dataset

YAML_SPEC = """\
dataset:
  - shards: {root}/ia1-{{000..002}}.tar
    scaleprob: 0.3
  - shards: {root}/cdip-{{000..001}}.tar
    scale: [1.0, 3.0]
  - shards: {root}/bin-{{000..001}}.tar
    extensions: nrm.jpg
    scale: [0.3, 1.0]
  - shards: {root}/rendered.tar
    scaleprob: 1.0
"""


def _write(root, name, nsamples, fields=("txt",)):
    with wds.TarWriter(str(root / name), encoder=False) as writer:
        for i in range(nsamples):
            writer.write({"__key__": f"{i:04d}", **{f: f"{name} {i} {f}" for f in fields}})


@pytest.fixture
def shards(tmp_path):
    for name in ["ia1-000.tar", "ia1-001.tar", "ia1-002.tar", "cdip-000.tar", "cdip-001.tar",
                 "bin-000.tar", "bin-001.tar", "rendered.tar"]:
        _write(tmp_path, name, 10, fields=("txt", "nrm.jpg", "bin.jpg"))
    return tmp_path


def _origin(sample):
    return sample["__url__"].rsplit("/", 1)[-1].split("-")[0].split(".")[0]


def test_yaml_spec_from_a_file(shards):
    path = shards / "spec.yml"
    path.write_text(YAML_SPEC.format(root=shards))
    spec = load_spec(str(path))
    assert [len(c.urls) for c in spec.collections] == [3, 2, 2, 1]
    assert spec.collections[0].urls[2] == f"{shards}/ia1-002.tar"
    assert [c.scaleprob for c in spec.collections] == [0.3, 1.0, 1.0, 1.0]
    assert [c.scale for c in spec.collections] == [(1.0, 1.0), (1.0, 3.0), (0.3, 1.0), (1.0, 1.0)]
    assert [c.extensions for c in spec.collections] == [None, None, ("nrm.jpg",), None]
    assert load_spec(path) == spec  # a PathLike too


def test_json_spec_from_a_file_and_a_url(shards):
    document = {"dataset": [{"shards": [f"{shards}/ia1-000.tar", f"{shards}/rendered.tar"],
                             "scaleprob": 2, "extensions": ["txt", "nrm.jpg;bin.jpg"]}]}
    path = shards / "spec.json"
    path.write_text(json.dumps(document))
    expected = DatasetSpec((CollectionSpec((f"{shards}/ia1-000.tar", f"{shards}/rendered.tar"),
                                           2.0, (1.0, 1.0), ("bin.jpg", "nrm.jpg", "txt")),))
    assert load_spec(str(path)) == expected
    assert load_spec(f"file://{path}") == expected
    assert load_spec(f"pipe:cat {path}") == expected  # any gopen URL
    assert load_spec(document) == expected


def test_json_file_is_not_read_as_yaml(tmp_path):
    path = tmp_path / "spec.json"
    path.write_text("dataset:\n  - shards: a.tar\n")
    with pytest.raises(SpecError, match=r"spec\.json' is not valid JSON"):
        load_spec(str(path))


@pytest.mark.parametrize("document, message", [
    ({"datasets": []}, r"dataset spec: 'datasets' is not a known key"),
    ({"dataset": []}, r"'dataset' must be a non-empty list"),
    ({"dataset": ["a.tar"]}, r"collection 0 must be a mapping, not str"),
    ({"dataset": [{"shards": "a.tar"}, {"shards": "b.tar", "scal": 2}]},
     r"collection 1: 'scal' is not a known key \(known: extensions, scale, scaleprob, shards\)"),
    ({"dataset": [{"scaleprob": 1}]}, r"collection 0: 'shards' is missing"),
    ({"dataset": [{"shards": []}]}, r"collection 0: 'shards' must be a shard spec"),
    ({"dataset": [{"shards": "a-{0..2.tar"}]}, r"collection 0: 'shards' unbalanced braces"),
    ({"dataset": [{"shards": ""}]}, r"collection 0: 'shards' names an empty URL"),
    ({"dataset": [{"shards": "a.tar::"}]}, r"collection 0: 'shards' names an empty URL"),
    ({"dataset": [{"shards": "a.tar", "scaleprob": -0.5}]},
     r"collection 0: 'scaleprob' must not be negative, not -0.5"),
    ({"dataset": [{"shards": "a.tar", "scaleprob": "high"}]},
     r"collection 0: 'scaleprob' must be a finite number, not 'high'"),
    ({"dataset": [{"shards": "a.tar", "scaleprob": True}]}, r"'scaleprob' must be a finite number"),
    ({"dataset": [{"shards": "a.tar", "scale": [3.0, 1.0]}]},
     r"collection 0: 'scale' range \[3.0, 1.0\] has lo > hi"),
    ({"dataset": [{"shards": "a.tar", "scale": [1, 2, 3]}]},
     r"'scale' must be a number or a \[lo, hi\]"),
    ({"dataset": [{"shards": "a.tar", "scale": [-1, 2]}]}, r"'scale' must not be negative"),
    ({"dataset": [{"shards": "a.tar", "extensions": 3}]},
     r"'extensions' must be a string or a list"),
    ({"dataset": [{"shards": "a.tar", "extensions": " ; "}]}, r"'extensions' names no fields"),
    ({"dataset": [{"shards": "a.tar", "scaleprob": 0}, {"shards": "b.tar", "scale": 0}]},
     r"every collection has weight 0"),
])
def test_validation_errors(document, message):
    with pytest.raises(SpecError, match=message):
        load_spec(document)


def test_validation_error_in_a_file_names_the_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("dataset:\n  - shards: a.tar\n    probability: 2\n")
    message = r"collection 0: 'probability' is not a known key.*bad\.yaml"
    with pytest.raises(ValueError, match=message):
        load_spec(str(path))
    path.write_text("dataset: [unclosed\n")
    with pytest.raises(SpecError, match=r"bad\.yaml' is not valid YAML"):
        load_spec(str(path))
    path.write_text("- shards: a.tar\n")
    message = r"must be a mapping with a 'dataset' list, not list.*bad\.yaml"
    with pytest.raises(SpecError, match=message):
        load_spec(str(path))
    with pytest.raises(TypeError, match="a dataset spec is a dict, a path or a URL, not int"):
        load_spec(42)


def test_yaml_is_loaded_safely(tmp_path):
    path = tmp_path / "evil.yml"
    path.write_text("dataset: !!python/object/apply:os.system ['true']\n")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_spec(str(path))


def test_weights_fixed_and_drawn_per_epoch():
    spec = load_spec({"dataset": [{"shards": "a.tar", "scaleprob": 0.5, "scale": 4},
                                  {"shards": "b.tar", "scaleprob": 2.0, "scale": [1.0, 3.0]}]})
    draws = [spec.weights(seed=1, epoch=e) for e in range(400)]
    assert all(w[0] == 2.0 for w in draws)
    assert all(2.0 <= w[1] <= 6.0 for w in draws)
    assert len({w[1] for w in draws}) == 400
    assert sum(w[1] for w in draws) / 400 == pytest.approx(4.0, abs=0.2)
    assert spec.weights(seed=1, epoch=7) == draws[7]
    assert spec.weights(seed=2, epoch=7) != draws[7]


def test_spec_mix_uses_the_weights_of_each_epoch():
    spec = load_spec({"dataset": [{"shards": "a.tar", "scale": [0.0, 1.0]}, {"shards": "b.tar"}]})
    mix = SpecMix([[1], [2]], spec, seed=3)
    assert mix.epoch_probs(5) == spec.weights(3, 5)
    with pytest.raises(ValueError, match="got 1 datasets for 2 collections"):
        SpecMix([[1]], spec)


def test_mixing_proportions(shards):
    spec = {"dataset": [{"shards": f"{shards}/ia1-{{000..002}}.tar", "scaleprob": 3},
                        {"shards": f"{shards}/cdip-{{000..001}}.tar", "scaleprob": 1},
                        {"shards": f"{shards}/rendered.tar", "scaleprob": 1, "scale": 0}]}
    dataset = spec_dataset(spec, seed=0, resampled=True)
    counts = Counter(_origin(s) for s in islice(dataset, 4000))
    assert set(counts) == {"ia1", "cdip"}
    assert counts["ia1"] / 4000 == pytest.approx(0.75, abs=0.03)


def test_once_through_with_longest_reads_every_sample_once(shards):
    spec = {"dataset": [{"shards": f"{shards}/ia1-{{000..002}}.tar"},
                        {"shards": f"{shards}/rendered.tar", "scaleprob": 5}]}
    keys = Counter((s["__url__"], s["__key__"]) for s in spec_dataset(spec, longest=True))
    assert len(keys) == 40 and set(keys.values()) == {1}
    shortest = list(spec_dataset(spec))
    assert Counter(_origin(s) for s in shortest)["rendered"] == 10 and len(shortest) < 40


def test_seeded_and_picklable(shards):
    spec = shards / "spec.yml"
    spec.write_text(YAML_SPEC.format(root=shards))
    def names(dataset):
        return [s["__url__"] + s["__key__"] for s in islice(dataset, 300)]

    def make(seed):
        return spec_dataset(str(spec), seed=seed, resampled=True)

    first = names(make(4))
    assert names(make(4)) == first
    assert names(pickle.loads(pickle.dumps(make(4)))) == first
    assert names(make(5)) != first


def test_extensions_filter_fields_and_samples(tmp_path):
    _write(tmp_path, "mixed.tar", 6, fields=("txt", "nrm.jpg", "bin.jpg"))
    _write(tmp_path, "binonly.tar", 4, fields=("bin.jpg",))
    spec = {"dataset": [{"shards": [f"{tmp_path}/mixed.tar", f"{tmp_path}/binonly.tar"],
                         "extensions": "NRM.jpg;cls"}]}
    samples = list(spec_dataset(spec))
    assert len(samples) == 6
    for sample in samples:
        assert set(sample) - {"__local_path__"} == {"__key__", "__url__", "nrm.jpg"}
        assert sample["nrm.jpg"] == f"mixed.tar {int(sample['__key__'])} nrm.jpg".encode()


def test_extensions_written_with_a_leading_dot_name_the_fields(tmp_path):
    _write(tmp_path, "mixed.tar", 3, fields=("txt", "nrm.jpg"))
    spec = {"dataset": [{"shards": f"{tmp_path}/mixed.tar", "extensions": [".nrm.jpg"]}]}
    assert [sorted(s) for s in spec_dataset(spec)] == [["__key__", "__url__", "nrm.jpg"]] * 3


def test_dataloader_workers_split_the_shards(shards):
    spec = {"dataset": [{"shards": f"{shards}/ia1-{{000..002}}.tar"},
                        {"shards": f"{shards}/cdip-{{000..001}}.tar"}]}
    loader = DataLoader(spec_dataset(spec, longest=True), num_workers=2, batch_size=None)
    keys = Counter((s["__url__"], s["__key__"]) for s in loader)
    assert len(keys) == 50 and set(keys.values()) == {1}


def test_nodes_split_the_shards(shards, monkeypatch):
    spec = {"dataset": [{"shards": f"{shards}/ia1-{{000..002}}.tar"},
                        {"shards": f"{shards}/cdip-{{000..001}}.tar"}]}
    monkeypatch.setenv("WORLD_SIZE", "2")
    seen = []
    for rank in ("0", "1"):
        monkeypatch.setenv("RANK", rank)
        seen.append({s["__url__"].rsplit("/", 1)[-1] for s in spec_dataset(spec, longest=True)})
    assert seen == [{"ia1-000.tar", "ia1-002.tar", "cdip-000.tar"}, {"ia1-001.tar", "cdip-001.tar"}]


@pytest.mark.parametrize("name", ["spec.yml", "spec.json"])
def test_secure_mode_refuses_a_pipe_shard_of_a_spec_and_runs_nothing(http_server, tmp_path, monkeypatch, name):
    _write(tmp_path, "s.tar", 3)
    marker = tmp_path / "command-ran"
    command = f"pipe:touch {marker} && cat {tmp_path}/s.tar"
    text = json.dumps({"dataset": [{"shards": command}]}) if name.endswith(".json") else \
        f'dataset:\n  - shards: "{command}"\n    scaleprob: 1.0\n'
    url = http_server.put_file(name, text.encode())  # a remote spec: secure mode reads it
    assert [s["__key__"] for s in spec_dataset(url)] == ["0000", "0001", "0002"]
    assert marker.exists()  # out of secure mode the command runs
    marker.unlink()
    monkeypatch.setenv("WDS_SECURE", "1")
    assert load_spec(url).collections[0].urls == (command,)
    with pytest.raises(wds.ShardError, match=r"pipe: URLs \(shell commands\) are refused in secure mode "
                                             r"\(set by WDS_SECURE=1\)") as info:
        list(spec_dataset(url))
    assert info.value.url == command
    assert not marker.exists()


def test_a_remote_spec_in_secure_mode_reads_neither_the_environment_nor_local_files(http_server, tmp_path,
                                                                                      monkeypatch):
    _write(tmp_path, "private-0.tar", 1)
    monkeypatch.setenv("WDS_TOKEN", "s3cr3t")
    leaking = http_server.put_file("leak.json", json.dumps(
        {"dataset": [{"shards": http_server.url("data-${TOKEN}.tar")}]}).encode())
    listing = http_server.put_file("glob.json", json.dumps(
        {"dataset": [{"shards": f"{tmp_path}/private-*.tar"}]}).encode())
    assert load_spec(leaking).collections[0].urls == (http_server.url("data-s3cr3t.tar"),)  # as webdataset does
    assert load_spec(listing).collections[0].urls == (f"{tmp_path}/private-0.tar",)
    monkeypatch.setenv("WDS_SECURE", "1")
    with pytest.raises(SpecError, match=r"uses \$\{TOKEN\}, but a spec read from a remote document in secure "
                                        r"mode may not take values from the environment") as info:
        list(spec_dataset(leaking))
    assert "s3cr3t" not in str(info.value)
    assert not any("s3cr3t" in r.path for r in http_server.requests())
    assert load_spec(listing).collections[0].urls == (f"{tmp_path}/private-*.tar",)  # not globbed
    with pytest.raises(wds.ShardError, match="local files are refused in secure mode") as info:
        list(spec_dataset(listing))
    assert "private-0" not in str(info.value)
    program = load_spec({"dataset": [{"shards": "http://data.example/d-${TOKEN}.tar"}]})
    assert program.collections[0].urls == ("http://data.example/d-s3cr3t.tar",)  # the program's own spec


def test_a_spec_url_with_a_query_string_is_a_spec(http_server, tmp_path):
    """A presigned URL (``spec.yaml?X-Amz-Signature=...``) names a spec as its path does."""
    _write(tmp_path, "s.tar", 3)
    url = http_server.put_file("spec.yaml", f"dataset:\n  - shards: {tmp_path}/s.tar\n".encode())
    samples = list(wds.WebDataset(url + "?X-Amz-Signature=abc", shardshuffle=False))
    assert [s["__key__"] for s in samples] == ["0000", "0001", "0002"]
