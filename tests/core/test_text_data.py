"""Text as a modality of data (core/data.py, core/text.py): token ids stay int64 and are never standardised; text
columns of CSV and Hugging Face datasets files go through a local tokenizer; token ids given as numbers; data from a
trusted entry point; a model and data of different modalities are named before anything runs."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

from modelward.core.data import DataConfig, load_data
from modelward.core.entrypoints import TRUST_ENV
from modelward.errors import ConfigError, DataError

pytest.importorskip("transformers", reason="the text extra (transformers) is not installed")
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "text_classifier" / "prepare.py"


def _example():  # noqa: ANN202 - the example's prepare module (its sentences and word-level tokenizer)
    spec = importlib.util.spec_from_file_location("text_example_prepare", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("tok")
    _example().tokenizer(d)
    return d


def test_synthetic_text_is_token_ids_never_standardised():
    cfg = DataConfig(source="synthetic_text", n_samples=200, num_classes=3, max_length=16, seed=3)
    a, b = load_data(cfg), load_data(cfg)
    assert a.x_train.dtype == torch.int64 and a.modality == "text" and a.pad_id == 0
    assert torch.equal(a.x_train, b.x_train) and torch.equal(a.y_test, b.y_test)  # seeded
    assert int(a.x_train.min()) >= 0 and a.token_name(1) == "[CLS]"
    assert not torch.equal(load_data(cfg.model_copy(update={"seed": 4})).x_train, a.x_train)


def test_csv_text_column_through_a_local_tokenizer(tmp_path, tokenizer_dir):
    ex = _example()
    for name, seed in (("train.csv", 1), ("test.csv", 2)):
        texts, labels = ex.sentences(30, seed)
        (tmp_path / name).write_text("label,text,other\n" + "".join(f'{y},"{t}",9\n' for t, y in zip(texts, labels,
                                                                                                       strict=True)))
    d = load_data(DataConfig(source="csv", path=str(tmp_path / "train.csv"), test_path=str(tmp_path / "test.csv"),
                             label_column="label", text_column="text", tokenizer=str(tokenizer_dir), max_length=12))
    assert d.x_train.dtype == torch.int64 and d.x_train.shape == (30, d.x_test.shape[1])
    assert d.x_train.shape[1] <= 12 and d.held_out_given
    first = [d.token_name(int(i)) for i in d.x_train[0] if int(i) != d.pad_id]
    assert first[0] == "[CLS]" and first[-1] == "[SEP]"
    assert set(d.special_ids) >= {0, 1, 2, 3}
    with pytest.raises(ValueError, match="text_column needs data.tokenizer"):
        DataConfig(source="csv", path="x.csv", label_column="label", text_column="text")


def test_hf_datasets_parquet_and_save_to_disk(tmp_path, tokenizer_dir):
    datasets = pytest.importorskip("datasets", reason="the datasets library is not installed")
    ex = _example()
    tr, te = ex.sentences(40, 1), ex.sentences(20, 2)
    datasets.Dataset.from_dict({"text": tr[0], "label": tr[1]}).to_parquet(tmp_path / "train.parquet")
    datasets.Dataset.from_dict({"text": te[0], "label": te[1]}).to_parquet(tmp_path / "test.parquet")
    common = {"source": "hf_datasets", "label_column": "label", "text_column": "text", "tokenizer": str(tokenizer_dir)}
    d = load_data(DataConfig(path=str(tmp_path / "train.parquet"), test_path=str(tmp_path / "test.parquet"), **common))
    assert (len(d.x_train), len(d.x_test)) == (40, 20) and d.held_out_given and d.is_text
    feats = datasets.Features({"text": datasets.Value("string"),
                               "label": datasets.ClassLabel(names=["sport", "money", "weather"])})
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": tr[0], "label": tr[1]}, features=feats),
                               "test": datasets.Dataset.from_dict({"text": te[0], "label": te[1]}, features=feats)})
    dd.save_to_disk(str(tmp_path / "saved"))
    d2 = load_data(DataConfig(path=str(tmp_path / "saved"), **common))
    assert d2.class_names == ("sport", "money", "weather")  # a ClassLabel's names
    assert torch.equal(d2.x_train, d.x_train) and torch.equal(d2.y_test, d.y_test)  # the same texts, one tokenizer
    with pytest.raises(DataError, match="column 'body' not found"):
        load_data(DataConfig(path=str(tmp_path / "saved"), **{**common, "text_column": "body"}))


def test_token_ids_given_as_numbers(tmp_path):
    ids = np.array([[1, 5, 6, 2, 0], [1, 7, 2, 0, 0], [1, 8, 9, 9, 2], [1, 4, 2, 0, 0]] * 5)
    np.savez(tmp_path / "t.npz", x=ids, y=np.arange(20) % 2)
    d = load_data(DataConfig(source="npz", path=str(tmp_path / "t.npz"), tokens=True, seed=0))
    assert d.x_train.dtype == torch.int64 and set(d.x_train.flatten().tolist()) <= set(ids.flatten().tolist())
    z = load_data(DataConfig(source="npz", path=str(tmp_path / "t.npz")))  # without tokens = true: numbers
    assert z.x_train.dtype == torch.float32 and not z.is_text
    np.savez(tmp_path / "bad.npz", x=ids + 0.5, y=np.arange(20) % 2)
    with pytest.raises(DataError, match="not whole numbers"):
        load_data(DataConfig(source="npz", path=str(tmp_path / "bad.npz"), tokens=True))


def _write_factory(folder: Path) -> None:
    (folder / "mydata.py").write_text(
        "import torch\n"
        "from torch.utils.data import DataLoader, TensorDataset\n"
        "def pair(n=40):\n"
        "    g = torch.Generator().manual_seed(0)\n"
        "    x = torch.rand(n, 3, generator=g); y = (x[:, 0] > 0.5).long()\n"
        "    return TensorDataset(x[:30], y[:30]), DataLoader(TensorDataset(x[30:], y[30:]), batch_size=4)\n"
        "def tokens():\n"
        "    return [{'input_ids': [1, 5, 2], 'label': 0}, {'input_ids': [1, 6, 7, 2], 'label': 1}] * 10\n")


def test_entrypoint_data_runs_only_when_the_operator_trusts_it(tmp_path, monkeypatch):
    _write_factory(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv(TRUST_ENV, raising=False)
    cfg = DataConfig(source="entrypoint", entrypoint="mydata:pair")
    with pytest.raises(ConfigError, match="trust"):
        load_data(cfg)
    monkeypatch.setenv(TRUST_ENV, "1")  # --trust-code
    d = load_data(cfg)
    assert (len(d.x_train), len(d.x_test)) == (30, 10) and d.held_out_given
    assert d.x_train.dtype == torch.float32 and abs(float(d.x_train.mean()) - 0.5) < 0.2  # not standardised
    t = load_data(DataConfig(source="entrypoint", entrypoint="mydata:tokens", tokens=True, seed=0))
    assert t.is_text and t.x_train.shape[1] == 4 and not t.held_out_given  # one set: split here, membership unknown
    with pytest.raises(DataError, match="set data.tokens = true"):
        load_data(DataConfig(source="entrypoint", entrypoint="mydata:tokens"))
