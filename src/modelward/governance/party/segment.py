"""What a party holds: its segment of the model, its data column, the activation shapes at its cuts.

A party holds one contiguous segment of the model and its own data column (the inputs for the first party, the
labels for the last; a middle party holds no data). :class:`Holding` builds the segment from the party's
configuration (its parameters drawn from the party's own secret randomness, or read from its own checkpoint),
checks the party's place in the chain, and validates every incoming tensor against the shapes and bounds it
knows (:meth:`Holding.input`, :meth:`Holding.bounded`).

Example:
    >>> h = Holding(load_party_config("parties/bob.toml"))  # doctest: +SKIP
    >>> h.is_last, h.in_shape  # doctest: +SKIP
    (True, (4, 4, 4))
"""

from __future__ import annotations

import copy
import secrets

import torch

from modelward.core.data import load_data
from modelward.core.init import init_model_
from modelward.core.io import load_into, load_tensors
from modelward.core.zoo import build_model
from modelward.errors import ConfigError, DataError
from modelward.governance.party.config import PartyConfig
from modelward.governance.party.tensors import layout, max_abs
from modelward.governance.plan import check_segment, model_layers, run_ops, segment_of
from modelward.governance.protocol import NumericError
from modelward.governance.wire import Message, WireError, expect


class Holding:
    """A party's segment, data column and shapes, built from its configuration.

    Args:
        cfg: the party's configuration (paths resolved).

    Attributes:
        segment: the party's layers (an ``nn.Module``, in training mode); params: its named parameters.
        all_layers / is_first / is_last: the model's layer names and the party's place among them.
        in_shape / out_shape: the activation shapes (no batch) entering and leaving the segment.
        x_train, x_test / y_train, y_test: the first party's inputs / the last party's labels (else None).
    """

    def __init__(self, cfg: PartyConfig) -> None:
        self.cfg = cfg
        full = build_model(cfg.model, tuple(cfg.input_shape), cfg.num_classes)
        layers = model_layers(full)
        names = [lay.name for lay in layers]
        start, end = check_segment(names, cfg.layers, f"party {cfg.name}: layers")
        self.all_layers, self.is_first, self.is_last = names, start == 0, end == len(names)
        self._check_roles()
        with torch.no_grad():  # activation shapes at every cut, from a dry run of the structure (no data)
            full.eval()
            x = torch.zeros(2, *cfg.input_shape)
            shapes = [tuple(x.shape[1:])]
            for lay in layers:
                x = run_ops(full, lay.ops, x)
                shapes.append(tuple(x.shape[1:]))
        self.in_shape, self.out_shape = shapes[start], shapes[end]
        if cfg.init.checkpoint is None:
            # the party's own secret randomness: a 64-bit seed from the OS CSPRNG, used once and never stored
            # (init.test_seed, refused off loopback, is the test-only way to make it reproducible)
            seed = cfg.init.test_seed if cfg.init.test_seed is not None else secrets.randbits(63)
            init_model_(full, cfg.init.scheme, seed)
            del seed
        self.segment = segment_of(full, cfg.layers, f"party {cfg.name}")
        del full  # the other layers (random, never used) go out of scope here
        if cfg.init.checkpoint is not None:
            self._load_own(cfg.init.checkpoint)
        self.segment.train()
        self.params = dict(self.segment.named_parameters())
        self.grad_params = [p for p in self.params.values() if p.requires_grad]
        self._warm: set[int] = set()
        self._load_data()

    # ----------------------------------------------------------------- setup
    def _check_roles(self) -> None:
        c = self.cfg
        if c.driver is None:
            raise ConfigError(f"party {c.name}: set driver = \"<name>\" (the pinned identity the driver uses)")
        if not self.is_first and c.prev is None:
            raise ConfigError(f"party {c.name}: holds {c.layers}, not the first layers; set prev = \"<name>\" (the "
                              "party that sends it activations)")
        if self.is_first and c.prev is not None:
            raise ConfigError(f"party {c.name}: holds the first layers (and the inputs); it has no prev")
        if not self.is_last and c.next is None:
            raise ConfigError(f"party {c.name}: holds {c.layers}, not the last layers; set next = \"<name>\"")
        if self.is_last and c.next is not None:
            raise ConfigError(f"party {c.name}: holds the last layers (and the labels); it has no next")

    def _load_own(self, path: str) -> None:
        from safetensors import safe_open  # (only a party that starts from its own checkpoint needs it)

        own = self.segment.state_dict()
        try:
            with safe_open(path, framework="pt") as f:
                keys = set(f.keys())
                missing = [k for k in own if k not in keys]
                if missing:
                    raise ConfigError(f"init.checkpoint {path}: missing this party's tensors {missing[:5]}")
                loaded = {k: f.get_tensor(k) for k in own}  # read only our own entries
        except (OSError, ValueError) as e:
            raise ConfigError(f"init.checkpoint {path}: cannot read ({e})") from None
        try:  # the project's one strict loader: shapes, dtypes (no silent cast), finite values, all named
            load_into(self.segment, loaded, f"init.checkpoint {path}")
        except DataError as e:
            raise ConfigError(str(e)) from None

    def _load_data(self) -> None:
        self.x_train = self.x_test = self.y_train = self.y_test = None
        need = (["x_train", "x_test"] if self.is_first else []) + (["y_train", "y_test"] if self.is_last else [])
        if not need:
            return
        d = self.cfg.data
        if d is None:
            raise ConfigError(f"party {self.cfg.name}: holds the {'inputs' if self.is_first else 'labels'} "
                              f"(layers {self.cfg.layers}) and needs a [data] section")
        if d.file:
            t = load_tensors(d.file)
            missing = [k for k in need if k not in t]
            if missing:
                raise ConfigError(f"data.file {d.file}: missing tensors {missing} (has {sorted(t)})")
            src = {k: t[k] for k in need}
        else:
            split = load_data(d.dataset)
            src = {k: getattr(split, k) for k in need}
        for k, v in src.items():
            setattr(self, k, v)
        if self.is_first:
            for k in ("x_train", "x_test"):
                if tuple(getattr(self, k).shape[1:]) != tuple(self.cfg.input_shape):
                    raise ConfigError(f"data: {k} has shape {list(getattr(self, k).shape[1:])} per sample, "
                                      f"input_shape is {self.cfg.input_shape}")
                setattr(self, k, getattr(self, k).float())
        if self.is_last:
            self.y_train, self.y_test = self.y_train.long(), self.y_test.long()

    def warm_up(self, batch_sizes: list[int]) -> None:
        """Run forward and backward once per batch size on a throw-away copy of the segment (zeros in, RNG state
        kept), so that torch's one-time kernel set-up happens when a session opens rather than inside the first
        training steps. The party's parameters, buffers and optimizer state are not touched."""
        sizes = sorted({min(b, self.cfg.max_batch) for b in batch_sizes} - self._warm)
        if not sizes:
            return
        seg = copy.deepcopy(self.segment)
        with torch.random.fork_rng(devices=[]):
            for b in sizes:
                x = torch.zeros(b, *self.in_shape)
                seg.train()
                inp = layout(x).requires_grad_(not self.is_first)
                seg(inp).sum().backward()
                seg.eval()
                with torch.no_grad():
                    seg(layout(x))
                self._warm.add(b)

    # ----------------------------------------------------------------- incoming tensors
    def bounded(self, t: torch.Tensor, what: str) -> torch.Tensor:
        """Refuse an incoming float tensor with a non-finite value or a magnitude beyond max_abs_input."""
        m = max_abs(t)
        if not m <= self.cfg.max_abs_input:  # also true for NaN
            raise NumericError(f"party {self.cfg.name}: incoming {what} has max |value| {m:.3g}, beyond "
                               f"max_abs_input = {self.cfg.max_abs_input:g} (or non-finite); refused, nothing "
                               "computed")
        return t

    def idx(self, msg: Message, split: str, limit: int) -> torch.Tensor:
        """The batch indices of `msg`, checked against this party's data (a middle party holds none)."""
        idx = expect(msg, "idx", torch.int64, (None,), limit)
        n = None  # a middle party holds no data: the indices only travel on to the label holder
        if self.is_first:
            n = len(self.x_train if split == "train" else self.x_test)
        elif self.is_last:
            n = len(self.y_train if split == "train" else self.y_test)
        if len(idx) == 0:
            raise WireError("empty batch")
        if n is not None and (int(idx.min()) < 0 or int(idx.max()) >= n):
            raise WireError(f"indices out of range [0, {n}) for split {split!r}")
        return idx

    @staticmethod
    def split_of(msg: Message) -> str:
        """``meta.split`` of `msg` (train by default), one of train or test."""
        split = msg.meta.get("split", "train")
        if split not in ("train", "test"):
            raise WireError(f"meta.split {split!r}: valid choices: train, test")
        return split

    def input(self, msg: Message, split: str, limit: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(indices, this party's input): its own samples for the first party, the activation otherwise."""
        idx = self.idx(msg, split, limit)
        if self.is_first:
            return idx, (self.x_train if split == "train" else self.x_test)[idx]
        h = self.bounded(expect(msg, "h", torch.float32, (len(idx), *self.in_shape), limit), "activation h")
        return idx, h

    def labels(self, split: str) -> torch.Tensor:
        """The label holder's labels of `split`."""
        assert self.is_last
        return self.y_train if split == "train" else self.y_test

    def limit(self) -> int:
        """Rows per message: the hard limit and the policy's, whichever is lower."""
        return min(self.cfg.max_batch, self.cfg.policy.max_batch or self.cfg.max_batch)

    def n(self, split: str) -> int | None:
        """Samples of `split` this party holds (None for a middle party)."""
        src = (self.x_train if split == "train" else self.x_test) if self.is_first else \
            (self.y_train if split == "train" else self.y_test)
        return None if src is None else len(src)

    def forward_eval(self, x: torch.Tensor) -> torch.Tensor:
        """The segment on `x` in evaluation mode, without gradients (back in training mode afterwards)."""
        self.segment.eval()
        try:
            with torch.no_grad():
                return self.segment(layout(x))
        finally:
            self.segment.train()
