"""Text as a modality: token ids in, the embedding layer as the continuous space attacks and attributions work in.

A text input is a row of token ids (``int64``, length L), right-padded with the data's ``pad_id``; the attention
mask is ``ids != pad_id`` (so it travels with the ids: through attacks, shadow models and the guarded API alike).
Text reaches modelward as

- raw text in a CSV column or a Hugging Face ``datasets`` file, turned into ids by a *local* tokenizer
  (:func:`tokenize`: a ``save_pretrained`` folder or a ``tokenizer.json``; nothing is downloaded);
- token ids already (an ``.npz`` or CSV of integers with ``data.tokens = true``);
- the seeded synthetic task :func:`synthetic_text` (tests and examples).

Gradient-based methods cannot differentiate through integer ids. They work at the token embedding layer
(:func:`token_embedding`) through :func:`embedding_delta`, which adds a perturbation to that layer's output for
one forward pass: embedding-space attacks (Miyato et al. 2017; what a perturbation of the embeddings does, not a
text an attacker could type) and integrated gradients over the embeddings (Sundararajan et al. 2017, as Captum's
``LayerIntegratedGradients``). Attacks on the text itself substitute tokens (HotFlip, in
:mod:`modelward.robustness.attacks.hotflip`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from modelward.core.sources import import_transformers
from modelward.errors import ConfigError, DataError

#: the special tokens of :func:`synthetic_text` (ids 0..3)
SPECIAL = ("[PAD]", "[CLS]", "[SEP]", "[UNK]")


@dataclass(frozen=True)
class Tokens:
    """Token ids and what reads them.

    Attributes:
        ids: ``int64`` array N × L, right-padded with ``pad_id``.
        pad_id: the padding id (the attention mask is ``ids != pad_id``).
        vocab: id -> token string (for reports), or None when the tokenizer is not known.
        special: ids that are not words (padding, [CLS], [SEP], ...): never substituted by token attacks.
    """

    ids: np.ndarray
    pad_id: int
    vocab: tuple[str, ...] | None
    special: tuple[int, ...]


def load_tokenizer(path: str | Path) -> Any:
    """A local Hugging Face tokenizer: a folder written by ``save_pretrained`` (``tokenizer.json``, or ``vocab.txt``
    and friends) or a ``tokenizer.json`` file. Read with ``local_files_only`` and no remote code.

    Raises:
        DataError: the path does not exist or holds no tokenizer; ConfigError: transformers is not installed.
    """
    p = Path(path)
    if not p.exists():
        raise DataError(f"{p}: data.tokenizer not found (a save_pretrained folder or a tokenizer.json file)")
    tr = import_transformers()
    try:
        if p.is_file():
            return tr.PreTrainedTokenizerFast(tokenizer_file=str(p))
        return tr.AutoTokenizer.from_pretrained(str(p), local_files_only=True, trust_remote_code=False)
    except (OSError, ValueError, TypeError) as e:
        raise DataError(f"{p}: not a tokenizer transformers can read locally ({str(e).splitlines()[0]})") from None


def tokenize(texts: Sequence[str], tokenizer: str | Path, max_length: int, where: str) -> Tokens:
    """Token ids of `texts` with the local tokenizer at `tokenizer` (truncated to `max_length`, right-padded to the
    longest row).

    Args:
        texts: the raw texts, one per example.
        tokenizer: a tokenizer folder or ``tokenizer.json`` (:func:`load_tokenizer`).
        max_length: the longest row kept (tokens beyond it are cut, special tokens included).
        where: the data file, named in errors.

    Returns:
        :class:`Tokens` with the tokenizer's pad id, vocabulary and special ids.
    """
    tok = load_tokenizer(tokenizer)
    if tok.pad_token_id is None:
        raise DataError(f"{tokenizer}: the tokenizer has no padding token; add one (e.g. [PAD]) so rows of "
                        "different lengths can be batched")
    enc = tok(list(texts), padding="longest", truncation=True, max_length=max_length, return_attention_mask=True)
    ids = np.asarray(enc["input_ids"], dtype=np.int64)
    if ids.ndim != 2 or len(ids) == 0:
        raise DataError(f"{where}: no text to tokenize")
    mask = np.asarray(enc["attention_mask"], dtype=bool)
    if tok.padding_side != "right" or (ids[~mask] != tok.pad_token_id).any():
        raise DataError(f"{tokenizer}: modelward expects right padding with the pad token (padding_side='right')")
    vocab_map = tok.get_vocab()
    vocab = [""] * (max(vocab_map.values()) + 1)
    for t, i in vocab_map.items():
        vocab[i] = t
    return Tokens(ids, int(tok.pad_token_id), tuple(vocab), tuple(sorted(set(tok.all_special_ids))))


def token_rows(x: np.ndarray, pad_id: int, where: str) -> np.ndarray:
    """Validate integer token ids read from a file (``data.tokens = true``): 2-D, non-negative integers."""
    if x.ndim != 2:
        raise DataError(f"{where}: token ids must be a 2-D array (rows × positions), got shape {x.shape}")
    if np.issubdtype(x.dtype, np.floating):
        if not np.all(np.isfinite(x)) or not np.all(x == np.round(x)):
            raise DataError(f"{where}: data.tokens = true but the values are not whole numbers (token ids)")
    elif not np.issubdtype(x.dtype, np.integer):
        raise DataError(f"{where}: token ids must be integers, got dtype {x.dtype}")
    x = x.astype(np.int64)
    if (x < 0).any():
        raise DataError(f"{where}: token ids must be >= 0 (the padding id is {pad_id})")
    return x


def synthetic_text(n: int, num_classes: int, vocab_size: int, max_length: int, seed: int,
                   label_noise: float = 0.0) -> tuple[Tokens, np.ndarray]:
    """A seeded keyword task: each class owns 4 keywords; a sentence is [CLS], 4–(L−2) filler words with 1–2
    keywords of its class (and, one time in three, one keyword of another class) at random places, [SEP], padding.

    Args:
        n: sentences; num_classes: classes (≥ 2); vocab_size: the vocabulary (≥ 4 specials + 4 keywords per
            class + 8 fillers); max_length: L (≥ 8); seed: the generator's seed; label_noise: the fraction of labels
            replaced by a random class (memorised rows: what membership inference finds).

    Returns:
        ``(Tokens, labels)``: ids N × L with pad 0 and a vocabulary ``[PAD] [CLS] [SEP] [UNK] w0 w1 … k0_0 …``.

    Example:
        >>> t, y = synthetic_text(6, 3, 40, 12, seed=0)
        >>> t.ids.shape, int(t.ids[0, 0]), sorted(set(y.tolist())) <= [0, 1, 2]
        ((6, 12), 1, True)
    """
    kw = 4
    n_fill = vocab_size - len(SPECIAL) - kw * num_classes
    if n_fill < 8 or max_length < 8 or num_classes < 2:
        raise ConfigError(f"synthetic_text: vocab_size {vocab_size} is too small for {num_classes} classes (needs "
                          f"{len(SPECIAL) + kw * num_classes + 8}), or max_length {max_length} < 8")
    rng = np.random.default_rng(seed)
    first_kw = len(SPECIAL) + n_fill
    vocab = [*SPECIAL, *(f"w{i}" for i in range(n_fill)),
             *(f"k{c}_{j}" for c in range(num_classes) for j in range(kw))]
    ids = np.zeros((n, max_length), dtype=np.int64)
    y = rng.integers(0, num_classes, n)
    for i in range(n):
        length = int(rng.integers(4, max_length - 1))
        words = rng.integers(len(SPECIAL), first_kw, length)
        for _ in range(int(rng.integers(1, 3))):
            words[rng.integers(0, length)] = first_kw + kw * y[i] + rng.integers(0, kw)
        if rng.random() < 1 / 3:
            other = (y[i] + rng.integers(1, num_classes)) % num_classes
            words[rng.integers(0, length)] = first_kw + kw * other + rng.integers(0, kw)
        ids[i, 0] = 1
        ids[i, 1 : 1 + length] = words
        ids[i, 1 + length] = 2
    flip = rng.random(n) < label_noise
    y[flip] = rng.integers(0, num_classes, int(flip.sum()))
    return Tokens(ids, 0, tuple(vocab), (0, 1, 2, 3)), y.astype(np.int64)


# -------------------------------------------------------------------------------------------- the embedding layer
def token_embedding(model: nn.Module) -> nn.Embedding:
    """The model's token embedding table: ``model.token_embedding()`` when it has one (HF models through
    :class:`~modelward.core.sources.HFSequenceClassifier`), else its first ``nn.Embedding``.

    Raises:
        ConfigError: the model has no ``nn.Embedding`` (it cannot take token ids).
    """
    own = getattr(model, "token_embedding", None)
    if callable(own):
        emb = own()
        if isinstance(emb, nn.Embedding):
            return emb
    for m in model.modules():
        if isinstance(m, nn.Embedding):
            return m
    raise ConfigError(f"{type(model).__name__} has no nn.Embedding layer: it does not take token ids, so the text "
                      "attacks and attributions (which work at the embedding layer) cannot run on it")


@contextmanager
def embedding_delta(model: nn.Module, delta: torch.Tensor | None) -> Iterator[nn.Embedding]:
    """For forward passes inside the block, the token embedding layer outputs ``E[ids] + delta`` (``delta``:
    N × L × D, or None for no change): gradients reach ``delta`` as they would reach continuous inputs.

    Example:
        >>> emb = nn.Embedding(5, 2); net = nn.Sequential(emb, nn.Flatten(), nn.Linear(6, 2))
        >>> d = torch.zeros(1, 3, 2, requires_grad=True)
        >>> with embedding_delta(net, d):
        ...     net(torch.tensor([[1, 2, 0]])).sum().backward()
        >>> d.grad.shape
        torch.Size([1, 3, 2])
    """
    emb = token_embedding(model)
    if delta is None:
        yield emb
        return

    def hook(_m: nn.Module, _inp: Any, out: torch.Tensor) -> torch.Tensor:
        return out + delta.to(out.dtype)

    handle = emb.register_forward_hook(hook)
    try:
        yield emb
    finally:
        handle.remove()


class EmbeddingSpace(nn.Module):
    """The model seen as a function of an additive perturbation of one batch's token embeddings: ``forward(delta)``
    = ``model(ids)`` with ``E[ids] + delta`` at the embedding layer. Attacks written for continuous inputs (PGD,
    FGSM) then run unchanged on ``delta`` (clean point: ``delta = 0``); the attention mask still comes from the ids,
    so padding positions never influence the logits (their gradient is zero).

    Args:
        model: the text classifier (token ids -> logits).
        ids: the batch of token ids the perturbation belongs to (N × L); ``forward`` takes N × L × D (attack
            at most 1,024 rows at a time: ``predict`` cuts larger batches, which this module refuses).
    """

    def __init__(self, model: nn.Module, ids: torch.Tensor) -> None:
        super().__init__()
        self.model = model
        self.ids = ids
        self.dim = token_embedding(model).embedding_dim

    def zeros(self) -> torch.Tensor:
        """The clean point: a zero perturbation of the batch's shape."""
        return torch.zeros(*self.ids.shape, self.dim, device=self.ids.device)

    def forward(self, delta: torch.Tensor) -> torch.Tensor:
        if delta.shape[0] != self.ids.shape[0]:
            raise ValueError(f"EmbeddingSpace holds {self.ids.shape[0]} rows, got a perturbation of {delta.shape[0]} "
                             "(attack it with all its rows in one batch)")
        with embedding_delta(self.model, delta):
            return self.model(self.ids)


def embedding_scale(model: nn.Module, special: Sequence[int] = ()) -> float:
    """The standard deviation of the token embedding table's entries (rows of special tokens left out): the unit
    embedding-space radii are stated in (as tabular radii are in units of each feature's σ)."""
    w = token_embedding(model).weight.detach()
    keep = torch.ones(w.shape[0], dtype=torch.bool)
    keep[[i for i in special if 0 <= i < w.shape[0]]] = False
    return float(w[keep].std())
