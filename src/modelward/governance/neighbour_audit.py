"""What a neighbour gets for its budget, against what completion costs (issue 26 item 3).

A neighbour of a part (the party before it in the chain) may run the passes the owner's policy allows. This module
runs, through an :class:`Oracle` that asks the real parties (or anything that answers as they do), the attacks a
hostile neighbour would try with exactly those passes, and reports **agreement vs rows queried until refused**:

``predict_natural`` / ``predict_augmented`` / ``predict_synthetic``
    surrogate extraction (Tramèr et al. 2016; the Knockoff/ActiveThief family): query ``predict`` with the
    attacker's own activations (its own data through its own layers), with those plus noise and mixup, or with
    Gaussian activations of the same per-feature mean and spread; fit a fresh copy of the victim part's
    architecture (which the attacker knows, seed 000 §3) to the answers (cross-entropy on labels, soft
    cross-entropy on probabilities).
``eval_oracle``
    the duplicate-index soft-label oracle: ``eval`` of ``dup`` copies of ``(h, i)`` with sample i of known class c
    returns ``dup·(logsumexp z(h) − z_c(h))``; one pass per class gives the victim's log-softmax at h up to a
    constant, then the surrogate is fitted as above.
``labels_from_answers``
    ``predict`` on the label holder's training split: the share of answers whose top class is the training label.
``labels_from_gradients``
    k-means of the cut-layer gradients the neighbour receives in training, clusters matched to labels by the best
    assignment (Hungarian): the share of labels recovered (:func:`gradient_label_recovery`).

Agreement is the share of held-out activations on which the surrogate's top class equals the victim's. Its
floor (``chance``) is the share of the victim's most frequent answer: what a neighbour gets knowing nothing. Beside
it stands **completion**: the labelled rows a neighbour that holds the whole training set needs to retrain the
part from scratch to the same agreement (the MC-hardness threat model of seed 000 §3, in rows) —
:func:`completion_rows`.

The harness stands in for every organisation: it reads the victim part only to score agreement, never to attack.

Example:
    >>> points = surrogate_curve(oracle, victim, queries, [64, 256])  # doctest: +SKIP
    >>> write_extraction(out_dir, points)  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from modelward.core.records import atomic_write_json, write_csv
from modelward.core.seed import seeded
from modelward.errors import ModelwardError
from modelward.governance.flow_policy import as_labels

COLUMNS = ("part", "attack", "rows", "agreement", "refused", "chance", "note")


class Withheld(ModelwardError):
    """The owner ran the pass but released nothing (its answer or privacy budget for the caller is spent)."""


class Oracle(Protocol):
    """The passes a neighbour may run on the victim part, as the owner's policy answers them.

    ``predict(h, split)`` returns the released answer (``{"labels"}``, ``{"topk"}`` or ``{"probs"}``, see
    :func:`~modelward.governance.flow_policy.Release`) and ``eval_sum(h, idx, split, metric)`` the metric's sum;
    ``train_step(h, idx, commit)`` runs a training step on the training rows `idx` with activations `h` and
    returns the training loss the neighbour gets to see for it (the step's own answer, then the step is aborted
    with the control key; or, with `commit`, the step committed and the committed window's mean loss read from the
    next evaluation's answer), None where nothing of it is released. All raise a
    :class:`~modelward.errors.ModelwardError` when refused (:class:`Withheld` when the pass ran and nothing left).
    """

    def predict(self, h: Tensor, split: str = "test", idx: Tensor | None = None) -> dict[str, Tensor]: ...

    def eval_sum(self, h: Tensor, idx: Tensor, split: str, metric: str) -> float: ...

    def train_step(self, h: Tensor, idx: Tensor, commit: bool = False) -> float | None: ...


@dataclass(frozen=True)
class Point:
    """One measurement: after `rows` rows the attack reached `agreement` (or label share); `refused` once the
    party refused (the curve ends there)."""

    part: str
    attack: str
    rows: int
    agreement: float
    refused: bool
    chance: float
    note: str = ""


@dataclass
class Victim:
    """The part under attack, as the harness knows it.

    Args:
        part: its name in reports (``"bob: conv2,fc1,logits"``).
        reference: its true logits on activations (used to score agreement only).
        make_surrogate: a fresh, randomly initialised copy of its architecture.
        num_classes: the number of classes.
    """

    part: str
    reference: Callable[[Tensor], Tensor]
    make_surrogate: Callable[[], nn.Module]
    num_classes: int

    def top(self, h: Tensor) -> Tensor:
        with torch.no_grad():
            return self.reference(h).argmax(1)


def chance_agreement(victim: Victim, h_test: Tensor) -> float:
    """The agreement of a constant answer (the victim's most frequent class): the floor of every attack."""
    top = victim.top(h_test)
    return float(torch.bincount(top, minlength=victim.num_classes).max()) / len(top)


def agreement(model: nn.Module, victim: Victim, h_test: Tensor) -> float:
    """Share of `h_test` on which `model` and the victim give the same top class."""
    model.eval()
    with torch.no_grad():
        return float((model(h_test).argmax(1) == victim.top(h_test)).float().mean())


def _targets(answer: dict[str, Tensor], k: int) -> Tensor:
    """Soft targets (rows on the simplex) from a released answer."""
    if "probs" in answer:
        return answer["probs"].float()
    labels = answer["labels"] if "labels" in answer else answer["topk"][:, 0]
    return F.one_hot(labels.long(), k).float()


def fit_surrogate(victim: Victim, h: Tensor, targets: Tensor, steps: int = 300, seed: int = 0,
                  lr: float = 3e-3, batch: int = 128) -> nn.Module:
    """Fit a fresh copy of the victim's architecture to (h, soft targets) with Adam and soft cross-entropy."""
    # the surrogate's init (and any dropout) drawn from `seed`; the caller's global RNG is left as it was
    with seeded(seed, numpy=False, python=False):
        model = victim.make_surrogate()
        model.train()
        opt = torch.optim.Adam(model.parameters(), lr=lr)
        g = torch.Generator().manual_seed(seed)
        n = len(h)
        for _ in range(steps):
            idx = torch.randint(n, (min(batch, n),), generator=g)
            loss = -(targets[idx] * F.log_softmax(model(h[idx]), 1)).sum(1).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    return model


def _top1(targets: Tensor) -> Tensor:
    """The attacker's other reading of a soft answer: its top class only (a defence that keeps top-1, as ModelGuard
    does, misleads a soft-label fit but not this one)."""
    return F.one_hot(targets.argmax(1), targets.shape[1]).float()


def _curve(part: str, attack: str, victim: Victim, h_test: Tensor, checkpoints: Sequence[int],
           ask: Callable[[int, int], Iterator[tuple[Tensor, Tensor]]], fit_steps: int, seed: int,
           rows_per_item: int = 1) -> list[Point]:
    """Query items in order (``ask(lo, hi)`` yields ``(h, targets)`` for the items answered, as they come), fit at
    each checkpoint (in rows), stop at refusal (what was answered before it counts). Soft answers are also read as
    their top class (attack ``<attack>_top1``, no extra queries): the attacker keeps the better of the two."""
    chance = chance_agreement(victim, h_test)
    hs: list[Tensor] = []
    ts: list[Tensor] = []
    points: list[Point] = []
    top1: list[Point] = []
    done = 0  # items answered
    for cp in sorted(checkpoints):
        want = max(1, cp // rows_per_item)
        refused, note = False, ""
        try:
            for h, t in ask(done, want) if want > done else ():
                hs.append(h)
                ts.append(t)
                done += len(h)
        except ModelwardError as e:
            refused, note = True, str(e)[:200]
        if done == 0:
            points.append(Point(part, attack, 0, chance, True, chance, note or "refused"))
            return points
        h_all, t_all = torch.cat(hs), torch.cat(ts)
        model = fit_surrogate(victim, h_all, t_all, fit_steps, seed)
        points.append(Point(part, attack, done * rows_per_item, agreement(model, victim, h_test), refused, chance,
                            note))
        if not bool(((t_all == 0) | (t_all == 1)).all()):  # soft answers: their top class too
            model = fit_surrogate(victim, h_all, _top1(t_all), fit_steps, seed)
            top1.append(Point(part, f"{attack}_top1", done * rows_per_item, agreement(model, victim, h_test),
                              refused, chance, note))
        if refused:
            break
    return points + top1


def query_pool(kind: str, h_natural: Tensor, n: int, seed: int = 0) -> Tensor:
    """`n` query activations of the attacker's own making: ``natural`` (its own data's activations), ``augmented``
    (natural plus 10 % Gaussian noise, half of them mixup pairs) or ``synthetic`` (Gaussian with the natural
    per-feature mean and spread, clipped at 0 where the natural activations are never negative)."""
    g = torch.Generator().manual_seed(seed)
    nat = h_natural[torch.randperm(len(h_natural), generator=g)]
    if kind == "natural":
        return nat[:n] if n <= len(nat) else nat[torch.randint(len(nat), (n,), generator=g)]
    base = nat[torch.randint(len(nat), (n,), generator=g)]
    sd = h_natural.std(0, keepdim=True)
    if kind == "augmented":
        other = nat[torch.randint(len(nat), (n,), generator=g)]
        lam = torch.rand(n, *([1] * (base.dim() - 1)), generator=g)
        mixed = torch.where(torch.arange(n).reshape(-1, *([1] * (base.dim() - 1))) % 2 == 0,
                            lam * base + (1 - lam) * other, base)
        out = mixed + 0.1 * sd * torch.randn(base.shape, generator=g)
    elif kind == "synthetic":
        out = h_natural.mean(0, keepdim=True) + sd * torch.randn(base.shape, generator=g)
    else:
        raise ModelwardError(f"query pool {kind!r}: valid choices: natural, augmented, synthetic")
    return out.clamp_min(0) if bool((h_natural >= 0).all()) else out


def surrogate_curve(oracle: Oracle, victim: Victim, queries: Tensor, h_test: Tensor, checkpoints: Sequence[int],
                    attack: str = "predict_natural", chunk: int = 64, fit_steps: int = 300,
                    seed: int = 0) -> list[Point]:
    """Agreement of a surrogate fitted to ``predict`` answers on `queries`, at each checkpoint (rows), until the
    party refuses. Queries go out in passes of at most `chunk` rows."""

    def ask(lo: int, hi: int) -> Iterator[tuple[Tensor, Tensor]]:
        for a in range(lo, min(hi, len(queries)), chunk):
            h = queries[a:min(hi, a + chunk)]
            yield h, _targets(oracle.predict(h, "test"), victim.num_classes)

    return _curve(victim.part, attack, victim, h_test, [c for c in checkpoints if c <= len(queries)], ask,
                  fit_steps, seed)


def eval_oracle_curve(oracle: Oracle, victim: Victim, queries: Tensor, h_test: Tensor, known: dict[int, int],
                      checkpoints: Sequence[int], dup: int = 8, fit_steps: int = 300, seed: int = 0) -> list[Point]:
    """The duplicate-index soft-label oracle through ``eval`` (module docstring): `known` maps each class to the
    index of a test sample of that class; each query point costs ``dup × classes`` rows."""
    k = victim.num_classes
    if sorted(known) != list(range(k)):
        raise ModelwardError(f"eval oracle: need one known sample per class 0..{k - 1}, got classes {sorted(known)}")

    def ask(lo: int, hi: int) -> Iterator[tuple[Tensor, Tensor]]:
        for i in range(lo, min(hi, len(queries))):
            h = queries[i:i + 1]
            ce = torch.empty(k)
            for c in range(k):
                s = oracle.eval_sum(h.expand(dup, *h.shape[1:]).contiguous(), torch.full((dup,), known[c]), "test",
                                    "cross_entropy")
                ce[c] = s / dup  # = logsumexp z(h) - z_c(h)
            yield h, torch.softmax(-ce, 0).unsqueeze(0)

    return _curve(victim.part, "eval_oracle", victim, h_test, checkpoints, ask, fit_steps, seed,
                  rows_per_item=dup * k)


def _probe(fixed_h: Tensor, probe: Tensor) -> Tensor:
    """The fixed rows' activations and one probe activation, as one batch."""
    return torch.cat([fixed_h, probe.unsqueeze(0)]).contiguous()


def eval_differencing_curve(oracle: Oracle, victim: Victim, queries: Tensor, h_test: Tensor, fixed_h: Tensor,
                            fixed_idx: Tensor, known: dict[int, int], checkpoints: Sequence[int], repeats: int = 1,
                            fit_steps: int = 300, seed: int = 0) -> list[Point]:
    """Issue 36's eval differencing: ``eval`` (cross-entropy) over the distinct test indices `fixed_idx` with the
    fixed activations `fixed_h`, plus one probe row: the probe activation on a test index of known class c, one
    pass per class. The answers differ only in the probe's cross-entropy, so ``softmax(-answers)`` is the victim's
    softmax at the probe (the fixed rows' sum cancels: softmax is shift-invariant). Each answer is the mean of
    `repeats` identical passes (an attacker averaging noise away). A point costs ``(len(fixed_idx) + 1) x classes x
    repeats`` rows; the surrogate is fitted to the recovered soft labels."""
    k = victim.num_classes
    if sorted(known) != list(range(k)) or set(known.values()) & set(fixed_idx.tolist()):
        raise ModelwardError(f"eval differencing: need one known test index per class 0..{k - 1}, none of them among "
                             "the fixed rows")
    rows = len(fixed_idx) + 1

    def ask(lo: int, hi: int) -> Iterator[tuple[Tensor, Tensor]]:
        for i in range(lo, min(hi, len(queries))):
            h = _probe(fixed_h, queries[i])
            ce = torch.empty(k, dtype=torch.float64)
            for c in range(k):
                idx = torch.cat([fixed_idx, torch.tensor([known[c]])])
                ce[c] = sum(oracle.eval_sum(h, idx, "test", "cross_entropy") for _ in range(repeats)) / repeats
            yield queries[i:i + 1], torch.softmax(-ce, 0).float().unsqueeze(0)

    return _curve(victim.part, "eval_differencing" if repeats == 1 else f"eval_differencing_x{repeats}", victim,
                  h_test, checkpoints, ask, fit_steps, seed, rows_per_item=rows * k * repeats)


def label_only_curve(oracle: Oracle, victim: Victim, pool: Tensor, h_test: Tensor, fixed_h: Tensor,
                     fixed_idx: Tensor, known: dict[int, int], checkpoints: Sequence[int], fit_steps: int = 300,
                     seed: int = 0, refit: int = 16) -> list[Point]:
    """Issue 36's label-only adaptive attack: ``eval`` (error) over the fixed rows plus a probe on a test index of
    known class c answers "is the victim's top class at the probe c?" (the sum is the fixed rows' errors, plus 0
    or 1). The first probe is asked for every class, which fixes the fixed rows' errors (the smallest answer);
    after that each probe asks the classes in the order the current surrogate ranks them, until a yes. Probes are
    chosen by active learning: the pool activation on which the current surrogate is least sure (smallest margin
    between its two best classes), the surrogate refitted every `refit` labels."""
    k = victim.num_classes
    chance = chance_agreement(victim, h_test)
    g = torch.Generator().manual_seed(seed)
    left = torch.randperm(len(pool), generator=g)
    hs: list[Tensor] = []
    ys: list[int] = []
    model: nn.Module | None = None
    base: float | None = None
    rows, points, cps = 0, [], sorted(checkpoints)

    def score(refused: bool, note: str) -> Point:
        if not ys:
            return Point(victim.part, "label_only", rows, chance, True, chance, note or "refused")
        m = fit_surrogate(victim, torch.cat(hs), F.one_hot(torch.tensor(ys), k).float(), fit_steps, seed)
        return Point(victim.part, "label_only", rows, agreement(m, victim, h_test), refused, chance, note)

    try:
        while cps and len(left):
            pick, order = 0, list(range(k))
            if model is not None:
                model.eval()
                with torch.no_grad():
                    top2 = torch.softmax(model(pool[left]), 1).topk(2, 1).values
                    pick = int((top2[:, 0] - top2[:, 1]).argmin())
                    order = torch.argsort(model(pool[left[pick]:left[pick] + 1])[0], descending=True).tolist()
            i = int(left[pick])
            left = torch.cat([left[:pick], left[pick + 1:]])
            h = _probe(fixed_h, pool[i])
            answers: dict[int, float] = {}
            for c in order:
                answers[c] = oracle.eval_sum(h, torch.cat([fixed_idx, torch.tensor([known[c]])]), "test", "error")
                rows += len(fixed_idx) + 1
                if base is not None and answers[c] < base + 0.5:
                    break
            if base is None:
                base = min(answers.values())
            hs.append(pool[i:i + 1])
            ys.append(min(answers, key=lambda c: answers[c]))
            if len(ys) % refit == 0:
                model = fit_surrogate(victim, torch.cat(hs), F.one_hot(torch.tensor(ys), k).float(), fit_steps, seed)
            while cps and rows >= cps[0]:
                cps.pop(0)
                points.append(score(False, ""))
    except ModelwardError as e:
        points.append(score(True, str(e)[:200]))
    return points


def loss_oracle(oracle: Oracle, probes: Tensor, y_train: Tensor, fixed_h: Tensor, fixed_idx: Tensor,
                probe_h: Tensor, known: dict[int, int], part: str, commit: bool = False) -> Point:
    """Issue 36's training-loss label oracle: a training step over the fixed training rows `fixed_idx` (fixed
    activations) and one row, training index i with the fixed activation `probe_h`; the loss the neighbour sees
    takes one value per class of i. Calibrated on one known training index per class (`known`), each probe's loss
    is matched to the nearest level. Without `commit` every step is aborted after its answer (the issue's 400 of
    400 labels); with it, every step is committed and the loss read from the committed window. A probe whose loss
    is not released is guessed (the first level). Returns the share of `probes` whose label is recovered (chance:
    the most frequent label's share)."""
    name = "loss_oracle_committed" if commit else "loss_oracle"
    chance = float(torch.bincount(y_train[probes]).max()) / len(probes)
    h = _probe(fixed_h, probe_h)
    rows, note, refused = 0, "", False
    levels: dict[int, float] = {}
    got: list[int] = []
    try:
        for c in sorted(known):
            v = oracle.train_step(h, torch.cat([fixed_idx, torch.tensor([known[c]])]), commit)
            rows += len(fixed_idx) + 1
            if v is not None:
                levels[c] = v
        for i in probes.tolist():
            v = oracle.train_step(h, torch.cat([fixed_idx, torch.tensor([i])]), commit)
            rows += len(fixed_idx) + 1
            got.append(min(levels, key=lambda c: abs(levels[c] - v)) if v is not None and levels else
                       min(known))
    except ModelwardError as e:
        refused, note = True, str(e)[:200]
    if not got:
        return Point(part, name, rows, chance, True, chance, note or "refused")
    share = float((torch.tensor(got) == y_train[probes[:len(got)]]).float().mean())
    if not levels:
        note = note or "no loss released (every probe guessed)"
    return Point(part, name, rows, share, refused, chance, note)


def labels_from_answers(oracle: Oracle, h_train: Tensor, y_train: Tensor, rows: int, part: str,
                        chunk: int = 64) -> Point:
    """``predict`` on the label holder's *training* split: the share of answers whose top class is the label."""

    chance = float(torch.bincount(y_train).max()) / len(y_train)
    got: list[Tensor] = []
    note = ""
    for a in range(0, rows, chunk):
        idx = torch.arange(a, min(rows, a + chunk))
        try:
            got.append(as_labels(oracle.predict(h_train[idx], "train", idx)))
        except ModelwardError as e:
            note = str(e)[:200]
            break
    n = sum(len(t) for t in got)
    if n == 0:
        return Point(part, "labels_from_answers", 0, chance, True, chance, note or "refused")
    share = float((torch.cat(got) == y_train[:n]).float().mean())
    return Point(part, "labels_from_answers", n, share, bool(note), chance, note)


def gradient_label_recovery(grads: Tensor, labels: Tensor, num_classes: int, seed: int = 0) -> tuple[float, float]:
    """k-means (k = classes) of the normalised cut-layer gradients, clusters matched to labels by the best
    one-to-one assignment (Hungarian; optimistic for the attacker). Returns (share recovered, the same score for
    randomly permuted labels: the chance level of this attack on this data)."""
    from scipy.optimize import linear_sum_assignment
    from sklearn.cluster import KMeans

    g = grads.detach().reshape(len(grads), -1).double()
    g = (g / g.norm(dim=1, keepdim=True).clamp_min(1e-12)).numpy()
    clusters = KMeans(num_classes, n_init=4, random_state=seed).fit_predict(g)
    y = labels.numpy()

    def score(lab: np.ndarray) -> float:
        m = np.zeros((num_classes, num_classes))
        np.add.at(m, (clusters, lab), 1)
        r, c = linear_sum_assignment(-m)
        return float(m[r, c].sum() / len(lab))

    perm = np.random.default_rng(seed).permutation(y)
    return score(y), score(perm)


def completion_rows(victim: Victim, h_train: Tensor, y_train: Tensor, h_test: Tensor, target: float,
                    batch: int = 64, max_steps: int = 2000, every: int = 10, lr: float = 0.05,
                    seed: int = 0) -> int | None:
    """Labelled rows a neighbour holding the whole training set needs to retrain the part from scratch (SGD with
    momentum, as the demo trains) to `target` agreement with it: completion's cost in rows (seed 000 §3.2 counts
    steps; a step here is `batch` rows). None if `max_steps` do not reach it."""
    with seeded(seed, numpy=False, python=False):  # as in fit_surrogate: no trace on the caller's global RNG
        model = victim.make_surrogate()
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
        g = torch.Generator().manual_seed(seed)
        for step in range(1, max_steps + 1):
            model.train()
            idx = torch.randint(len(h_train), (batch,), generator=g)
            loss = F.cross_entropy(model(h_train[idx]), y_train[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step % every == 0 and agreement(model, victim, h_test) >= target:
                return step * batch
    return None


def write_extraction(out_dir: str | Path, points: Sequence[Point], meta: dict[str, Any] | None = None,
                     title: str = "What a neighbour gets for its budget") -> dict[str, Path]:
    """``extraction.csv`` (columns part, attack, rows, agreement, refused, chance, note), ``extraction.json``
    (the points and `meta`, e.g. completion costs) and ``extraction.png`` (agreement vs rows, one line per part
    and attack; a refused curve ends with an ×)."""
    # lazy: matplotlib on first figure only
    from modelward.core.plots import plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = [{**asdict(p), "agreement": round(p.agreement, 4), "chance": round(p.chance, 4)} for p in points]
    paths = {"csv": write_csv(out / "extraction.csv", rows, list(COLUMNS)),
             "json": atomic_write_json(out / "extraction.json", {"points": rows, **(meta or {})})}
    fig, ax = plt.subplots(figsize=(7.0, 4.2))
    series: dict[tuple[str, str], list[Point]] = {}
    for p in points:
        series.setdefault((p.part, p.attack), []).append(p)
    for (part, attack), ps in series.items():
        xs = [max(p.rows, 1) for p in ps]
        line, = ax.plot(xs, [p.agreement for p in ps], marker="o", markersize=3, label=f"{part}: {attack}")
        if ps[-1].refused:
            ax.plot([xs[-1]], [ps[-1].agreement], marker="x", markersize=9, color=line.get_color())
    chances = sorted({round(p.chance, 3) for p in points})
    for c in chances[:3]:
        ax.axhline(c, color="grey", lw=0.8, ls=":")
    for name, rows_needed in ((meta or {}).get("completion_rows") or {}).items():
        if rows_needed:
            ax.axvline(rows_needed, color="black", lw=0.8, ls="--")
            ax.text(rows_needed, 0.02, f" completion ({name})", fontsize=7, rotation=90, va="bottom")
    ax.set_xscale("log")
    ax.set_xlabel("rows queried (x: refused)")
    ax.set_ylabel("agreement with the part / labels recovered")
    ax.set_ylim(0, 1.02)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "extraction.png", dpi=120)
    plt.close(fig)
    paths["png"] = out / "extraction.png"
    return paths
