"""HotFlip: token substitutions chosen by the gradient at the embedding layer (Ebrahimi et al., ACL 2018).

Flipping the token at position i from a to b changes the loss by about ``(e_b − e_a) · ∇_{e_i} L`` (a first-order
Taylor step in the one-hot input, their Eq. 2). Each round scores every (position, token) pair this way, evaluates
the ``candidates`` best exactly (forward passes) and keeps the one with the highest loss; a point stops as soon as it
is misclassified or has used its budget of substitutions. A position is substituted at most once; special tokens
(padding, [CLS], [SEP], ...) are never substituted and never inserted.

What its number means: robust accuracy against an attacker who may replace up to k tokens of a text by *any*
vocabulary tokens — no synonym, grammar or meaning constraint (the word-substitution attacks of TextAttack,
e.g. TextFooler, restrict b to synonyms and are therefore weaker). A model robust here is robust to those too;
a model broken here may only have been broken by changing the text's meaning.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from modelward.core.modules import eval_mode, model_device
from modelward.core.text import embedding_delta, token_embedding
from modelward.errors import ConfigError
from modelward.robustness.attacks.base import AttackResult


class HotFlip:
    """Greedy first-order token substitution (HotFlip, Ebrahimi et al. 2018), untargeted.

    Args:
        model: a text classifier (token ids -> logits) with a token ``nn.Embedding``.
        budget: the most substitutions per text: an int, or a fraction of its real (non-special) tokens (``0.1`` =
            10 %, at least 1).
        special_ids: token ids never substituted nor inserted (padding, [CLS], [SEP], [UNK], ...).
        candidates: (position, token) pairs evaluated exactly per round (beam of the greedy search).
        batch_size: texts attacked at a time.

    Returns:
        ``attack(ids, y)`` returns an :class:`~modelward.robustness.attacks.base.AttackResult`: ``x_adv`` the
        substituted ids, ``success`` True where the prediction is not ``y`` (points already wrong count as
        successes); :attr:`flips` holds the substitutions each text used.

    Example:
        >>> emb = nn.Embedding(20, 4); net = nn.Sequential(emb, nn.Flatten(), nn.Linear(24, 2))
        >>> ids = torch.randint(4, 20, (5, 6)); y = torch.zeros(5, dtype=torch.long)
        >>> res = HotFlip(net, budget=1, special_ids=(0, 1, 2, 3))(ids, y)
        >>> bool(((res.x_adv != ids).sum(1) <= 1).all())
        True
    """

    name = "hotflip"

    def __init__(self, model: nn.Module, budget: int | float = 0.1, special_ids: tuple[int, ...] | list[int] = (),
                 candidates: int = 32, batch_size: int = 64) -> None:
        if isinstance(budget, float) and not 0 < budget <= 1:
            raise ConfigError(f"hotflip: a fractional budget must be in (0, 1], got {budget}")
        if isinstance(budget, int) and budget < 0:
            raise ConfigError(f"hotflip: budget must be >= 0 substitutions, got {budget}")
        if candidates < 1 or batch_size < 1:
            raise ConfigError("hotflip: candidates and batch_size must be >= 1")
        self.model = model
        self.budget = budget
        self.special = sorted({int(i) for i in special_ids})
        self.candidates = candidates
        self.batch_size = batch_size
        self.flips = torch.zeros(0, dtype=torch.long)

    def budgets(self, ids: torch.Tensor) -> torch.Tensor:
        """Substitutions allowed per text (an int budget, or the fraction of its non-special tokens, at least 1)."""
        words = self._editable(ids).sum(1)
        if isinstance(self.budget, float):
            return torch.clamp((self.budget * words.float()).floor().long(), min=1).minimum(words)
        return torch.full_like(words, int(self.budget)).minimum(words)

    def _editable(self, ids: torch.Tensor) -> torch.Tensor:
        mask = torch.ones_like(ids, dtype=torch.bool)
        for s in self.special:
            mask &= ids != s
        return mask

    def __call__(self, ids: torch.Tensor, y: torch.Tensor) -> AttackResult:
        if ids.is_floating_point():
            raise ConfigError("hotflip attacks token ids (int64); got floating-point inputs")
        dev = model_device(self.model)
        outs, succ, flips = [], [], []
        with eval_mode(self.model, frozen_params=True):
            for i in range(0, len(ids), self.batch_size):
                xa, f = self._batch(ids[i : i + self.batch_size].to(dev), y[i : i + self.batch_size].to(dev))
                with torch.no_grad():
                    pred = self.model(xa).argmax(1)
                outs.append(xa)
                succ.append(pred != y[i : i + self.batch_size].to(dev))
                flips.append(f)
        self.flips = torch.cat(flips) if flips else torch.zeros(0, dtype=torch.long)
        return AttackResult(torch.cat(outs), torch.cat(succ))

    def _batch(self, ids: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        emb = token_embedding(self.model)
        table = emb.weight.detach()  # V × D
        vocab_ok = torch.ones(table.shape[0], dtype=torch.bool, device=ids.device)
        vocab_ok[[s for s in self.special if s < table.shape[0]]] = False
        x = ids.clone()
        budget = self.budgets(ids)
        editable = self._editable(ids)
        used = torch.zeros(len(x), dtype=torch.long, device=x.device)
        rows = torch.arange(len(x), device=x.device)
        for _ in range(int(budget.max()) if len(x) else 0):
            with torch.no_grad():
                active = (self.model(x).argmax(1) == y) & (used < budget)
            if not active.any():
                break
            a = rows[active]
            delta = torch.zeros(len(a), x.shape[1], table.shape[1], device=x.device, requires_grad=True)
            with torch.enable_grad(), embedding_delta(self.model, delta):
                loss = F.cross_entropy(self.model(x[a]), y[a], reduction="sum")
                (grad,) = torch.autograd.grad(loss, delta)  # n × L × D
            k = min(self.candidates, x.shape[1] * table.shape[0])
            top_gain, top = self._top_pairs(grad, x[a], editable[a], table, vocab_ok, k)  # n × k
            pos, tok = top // table.shape[0], top % table.shape[0]
            trial = x[a].unsqueeze(1).repeat(1, k, 1)  # n × k × L
            trial.scatter_(2, pos.unsqueeze(-1), tok.unsqueeze(-1))
            with torch.no_grad():
                logits = self.model(trial.flatten(0, 1))
                exact = F.cross_entropy(logits, y[a].repeat_interleave(k), reduction="none").view(len(a), k)
            exact[~torch.isfinite(top_gain)] = -torch.inf  # fewer than k editable pairs
            best = exact.argmax(1)
            ok = torch.isfinite(exact.gather(1, best.unsqueeze(1)).squeeze(1))
            pick = a[ok]
            x[pick] = trial[ok, best[ok]]
            editable[pick, pos[ok, best[ok]]] = False
            used[pick] += 1
        return x, used

    @staticmethod
    def _top_pairs(grad: torch.Tensor, x: torch.Tensor, editable: torch.Tensor, table: torch.Tensor,
                   vocab_ok: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The k (position, token) pairs of highest first-order gain per row, as flat indices ``pos · V + tok``;
        computed a few rows at a time (the gains are rows × L × V: a large vocabulary would not fit at once)."""
        n, length, _ = grad.shape
        v = table.shape[0]
        step = max(1, int(2**24 // max(1, length * v)))
        gains, idx = [], []
        for i in range(0, n, step):
            g = grad[i : i + step]
            # first-order gain of putting token b at position j: g_j·e_b − g_j·e_{x_j}
            gain = g @ table.T - (g * table[x[i : i + step]]).sum(-1, keepdim=True)  # rows × L × V
            gain[~editable[i : i + step]] = -torch.inf
            gain[:, :, ~vocab_ok] = -torch.inf
            gain.scatter_(2, x[i : i + step].unsqueeze(-1), -torch.inf)  # the token already there
            top_gain, top = gain.flatten(1).topk(k, dim=1)
            gains.append(top_gain)
            idx.append(top)
        return torch.cat(gains), torch.cat(idx)
