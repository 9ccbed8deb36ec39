"""Make the files `examples/assess_text_classifier.toml` reads, as a user's own project would have them: a small
BERT text classifier built from a ``transformers`` config (2 layers, a word-level vocabulary of the task's words),
trained in plain PyTorch and saved with ``save_pretrained`` (``model/``: config.json, model.safetensors and the
tokenizer), next to its train/test texts as parquet files (``train.parquet``, ``test.parquet``: columns ``text`` and
``label``).

The task is seeded and synthetic (nothing downloaded): short news-like sentences about three topics (sport, money,
weather); each holds one or two topic words among common filler words, and one sentence in three also a word of
another topic. Needs the text extra (``pip install -e '.[text]'``). Run it from anywhere:
``python examples/text_classifier/prepare.py`` (about a minute on 2 CPU cores; ``--steps``/``--train`` make it
smaller).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
TOPICS = {
    "sport": ["match", "goal", "team", "coach", "league", "striker", "season", "referee"],
    "money": ["market", "shares", "bank", "profit", "investor", "inflation", "budget", "tax"],
    "weather": ["rain", "storm", "sunny", "forecast", "wind", "snow", "cloudy", "heatwave"],
}
FILLER = ("the a an this that today yesterday new big small many some more less people city report said says "
          "after before during while about over under with without from into on at by for of and but or very "
          "quite really week year morning evening local national official latest early late again still").split()
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]


def sentences(n: int, seed: int) -> tuple[list[str], list[int]]:
    """`n` seeded sentences and their topic labels (0 sport, 1 money, 2 weather)."""
    rng = np.random.default_rng(seed)
    topics = list(TOPICS)
    texts, labels = [], []
    for _ in range(n):
        y = int(rng.integers(len(topics)))
        words = list(rng.choice(FILLER, int(rng.integers(5, 14))))
        for _ in range(int(rng.integers(1, 3))):
            words.insert(int(rng.integers(len(words) + 1)), str(rng.choice(TOPICS[topics[y]])))
        if rng.random() < 1 / 3:
            other = topics[(y + int(rng.integers(1, len(topics)))) % len(topics)]
            words.insert(int(rng.integers(len(words) + 1)), str(rng.choice(TOPICS[other])))
        texts.append(" ".join(words))
        labels.append(y)
    return texts, labels


def tokenizer(folder: Path):  # noqa: ANN201 - a transformers PreTrainedTokenizerFast
    """A word-level tokenizer of the task's words ([CLS] text [SEP], right padding with [PAD] = 0), built locally."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    words = SPECIALS + sorted(set(FILLER) | {w for ws in TOPICS.values() for w in ws})
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2),
                                                                                                  ("[SEP]", 3)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]",
                                   sep_token="[SEP]", padding_side="right")
    fast.save_pretrained(folder)
    return fast


def main(out: Path = HERE, n_train: int = 600, n_test: int = 400, steps: int = 400, seed: int = 0) -> float:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything here is built locally
    import pandas as pd
    from transformers import BertConfig, BertForSequenceClassification

    folder = out / "model"
    folder.mkdir(parents=True, exist_ok=True)
    train_texts, train_y = sentences(n_train, seed + 1)
    test_texts, test_y = sentences(n_test, seed + 2)
    pd.DataFrame({"text": train_texts, "label": train_y}).to_parquet(out / "train.parquet", index=False)
    pd.DataFrame({"text": test_texts, "label": test_y}).to_parquet(out / "test.parquet", index=False)
    tok = tokenizer(folder)
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64, num_labels=len(TOPICS), pad_token_id=0,
                        id2label=dict(enumerate(TOPICS)), label2id={t: i for i, t in enumerate(TOPICS)})
    model = BertForSequenceClassification(config)
    enc = tok(train_texts, padding="longest", return_tensors="pt")
    ids, mask, y = enc["input_ids"], enc["attention_mask"], torch.as_tensor(train_y)
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    gen = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(steps):
        idx = torch.randint(len(ids), (32,), generator=gen)
        opt.zero_grad()
        F.cross_entropy(model(input_ids=ids[idx], attention_mask=mask[idx]).logits, y[idx]).backward()
        opt.step()
    model.eval()
    te = tok(test_texts, padding="longest", return_tensors="pt")
    with torch.no_grad():
        pred = model(input_ids=te["input_ids"], attention_mask=te["attention_mask"]).logits.argmax(1)
    acc = float((pred == torch.as_tensor(test_y)).float().mean())
    model.save_pretrained(folder)  # config.json + model.safetensors
    print(f"wrote {out / 'train.parquet'}, {out / 'test.parquet'} and {folder} (test accuracy {acc:.3f})")
    return acc


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=HERE)
    p.add_argument("--train", type=int, default=600, help="training sentences")
    p.add_argument("--steps", type=int, default=400, help="Adam steps of 32 sentences")
    a = p.parse_args()
    sys.exit(0 if main(a.out, a.train, steps=a.steps) > 0 else 1)
