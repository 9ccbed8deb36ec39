"""One-run audit of a DP-SGD claim (Steinke, Nasr & Jagielski, NeurIPS 2023, "Privacy Auditing with One (1)
Training Run", arXiv:2305.08846).

The auditor adds m canaries to one DP-SGD training run, each included independently with probability ½ (the
secret vector S ∈ {−1, +1}^m), scores every canary after (or during) training, and guesses: **the k₊ highest
scores "in", the k₋ lowest "out", abstain on the rest** (the abstaining guesser of §5). With r = k₊ + k₋ guesses of
which v are right, the paper's Theorem 5.2 bounds the chance of v or more right guesses under (ε, δ)-DP:

    P[W ≥ v] ≤ β + 2 m δ · α,   β = P[Bin(r, q) ≥ v],   q = e^ε / (1 + e^ε),
    α = max_{i=1..v} P[v − i ≤ Bin(r, q) < v] / i                      (Appendix D, p_value_DP_audit)

and the audited lower bound is the largest ε whose p-value is still below 1 − confidence (a bisection; Appendix D,
get_eps_audit): with that confidence the run is **not** (ε_lb, δ)-DP. Because the canaries' inclusion is the
only randomness the theorem uses, the bound holds for any canary design and any score, chosen without seeing S.

Two canary kinds, in the same training run (each set is its own audit with its own m and S):

* **white-box** (§6, gradient canaries): Dirac gradients — canary i is C · e_{j_i}, C the clipping norm, a single
  coordinate j_i of the parameters. At every step each included canary is Poisson-sampled with the real data's
  rate q and its gradient is added to the clipped sum *before* Opacus adds the noise. The auditor sees every noisy
  gradient (the transcript DP-SGD's accountant covers), and scores canary i by Σ_t (noisy summed gradient)_{j_i}.
  Coordinates are chosen where the real data's initial gradients are smallest (``coordinates = "quiet"``) so the
  data does not drown the canaries; the choice uses the data but never S.
* **black-box** (§6, input-space canaries): training examples with a random wrong label, scored by the final
  model's negative loss on them (only the final model is seen).

k₊ = k₋ = k is taken from ``guesses``; trying several k is paid for with a Bonferroni split of 1 − confidence, so
the reported maximum is still a (confidence)-level bound. The claimed ε comes from the named Opacus accountant for
the *claimed* noise multiplier. The δ term 2 m δ α of the p-value puts a floor under it: with m canaries, a claim
at δ needs m δ ≪ 1 − confidence (m = 2000 canaries and δ = 10⁻⁵ in the example). ``noise_divisor > 1`` trains with σ / noise_divisor while the claim keeps σ — a
deliberately broken run the audit must catch.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from scipy import stats

from modelward.core.config import StrictModel, dump_config
from modelward.core.data import DataConfig, load_data
from modelward.core.records import write_table
from modelward.core.seed import seeded
from modelward.core.zoo import ModelConfig, build_model
from modelward.errors import ConfigError, DataError
from modelward.privacy.dp import Accountant, default_delta, epsilon_spent, noise_for_epsilon
from modelward.privacy.metrics import save_scores


# ---------------------------------------------------------------------------------------------------------------
# the statistics (Appendix D)
def p_value_dp_audit(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """P-value of ≥ v right guesses out of r on m canaries under (ε, δ)-DP (Theorem 5.2; Appendix D).

    Args:
        m: canaries, each included with probability ½; r: guesses made (abstentions excluded); v: right guesses.
        epsilon, delta: the DP guarantee of the null hypothesis.

    Returns:
        min(1, β + 2 m δ α) with β = P[Bin(r, q) ≥ v], q = e^ε/(1 + e^ε), α = max_i P[v − i ≤ Bin(r, q) < v]/i.

    Example:
        >>> round(p_value_dp_audit(100, 10, 10, 0.0, 0.0), 6)   # ten right coin flips: 2^-10
        0.000977
    """
    if not 0 <= v <= r <= m:
        raise DataError(f"p_value_dp_audit: need 0 ≤ v ≤ r ≤ m, got v={v}, r={r}, m={m}")
    if epsilon < 0 or not 0 <= delta <= 1:
        raise DataError(f"p_value_dp_audit: need ε ≥ 0 and δ ∈ [0, 1], got ε={epsilon}, δ={delta}")
    q = 1.0 / (1.0 + math.exp(-epsilon))  # accuracy of ε-DP randomised response
    beta = float(stats.binom.sf(v - 1, r, q))
    alpha = 0.0
    if delta > 0 and v > 0:
        pmf = stats.binom.pmf(np.arange(v - 1, -1, -1), r, q)  # P[Bin = v − i], i = 1..v
        alpha = float((np.cumsum(pmf) / np.arange(1, v + 1)).max())
    return min(beta + alpha * delta * 2 * m, 1.0)


def epsilon_lower_bound_one_run(m: int, r: int, v: int, delta: float, confidence: float = 0.95,
                                iterations: int = 40) -> float:
    """The largest ε at which ≥ v right guesses of r (m canaries) would have p-value < 1 − confidence (App. D).

    Args:
        m, r, v: canaries, guesses, right guesses; delta: δ of the claim; confidence: e.g. 0.95.
        iterations: bisection steps.

    Returns:
        ε_lb ≥ 0: with the given confidence the mechanism is not (ε_lb, δ)-DP.

    Example:
        >>> round(epsilon_lower_bound_one_run(1000, 100, 100, 0.0), 2)   # 100 of 100 right
        3.49
    """
    p = 1.0 - confidence
    if not 0 < p < 1:
        raise ConfigError(f"confidence must lie in (0, 1), got {confidence}")
    lo, hi = 0.0, 1.0
    if p_value_dp_audit(m, r, v, 0.0, delta) >= p:
        return 0.0
    while p_value_dp_audit(m, r, v, hi, delta) < p:
        lo, hi = hi, hi + 1.0
        if hi > 100:  # rejected even at ε = 100: report that (no finite claim survives)
            return lo
    for _ in range(iterations):
        mid = (lo + hi) / 2
        if p_value_dp_audit(m, r, v, mid, delta) < p:
            lo = mid
        else:
            hi = mid
    return lo


@dataclass(frozen=True)
class GuessOutcome:
    """The abstaining guesser's result on one canary set: k₊ = k₋ = k, r guesses, v right, and the bound."""

    m: int
    k: int
    r: int
    v: int
    epsilon_lb: float
    confidence: float


def right_guesses(scores: np.ndarray, included: np.ndarray, k: int) -> int:
    """Right guesses of the abstaining guesser: the k highest scores guessed "in", the k lowest "out" (ties
    broken at random with a fixed seed, never by S).

    Example:
        >>> right_guesses(np.array([3.0, 2.0, 1.0, 0.0]), np.array([True, False, True, False]), 1)
        2
    """
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    inc = np.asarray(included).astype(bool).reshape(-1)
    order = np.lexsort((np.random.default_rng(0).random(len(s)), s))  # ascending score
    return int(inc[order[len(s) - k:]].sum() + (~inc[order[:k]]).sum())


def audit_scores(scores: np.ndarray, included: np.ndarray, delta: float, guesses: list[int],
                 confidence: float = 0.95) -> GuessOutcome:
    """Guess top-k "in", bottom-k "out" for each k in ``guesses``; return the best bound (Bonferroni over k).

    Args:
        scores: one score per canary (higher = included); included: the truth S (bool).
        delta: the claim's δ; guesses: the k values to try (each k ≤ m/2; larger ones are skipped).
        confidence: the overall confidence; each of the K tried k is bounded at 1 − (1 − confidence)/K.

    Returns:
        :class:`GuessOutcome` of the k with the largest ε_lb (its confidence is the overall one).

    Example:
        >>> s = np.r_[np.ones(500), np.zeros(500)]; inc = s.astype(bool)
        >>> audit_scores(s, inc, 0.0, [100]).v
        200
    """
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    inc = np.asarray(included).astype(bool).reshape(-1)
    if s.shape != inc.shape:
        raise DataError(f"{len(s)} canary scores but {len(inc)} inclusion flags")
    m = len(s)
    ks = sorted({int(k) for k in guesses if 0 < int(k) <= m // 2})
    if not ks:
        raise ConfigError(f"guesses: no k in {guesses} fits m = {m} canaries (need 0 < k ≤ m/2)")
    per_k = 1.0 - (1.0 - confidence) / len(ks)
    best: GuessOutcome | None = None
    for k in ks:
        v = right_guesses(s, inc, k)
        eps = epsilon_lower_bound_one_run(m, 2 * k, v, delta, per_k)
        if best is None or eps > best.epsilon_lb:
            best = GuessOutcome(m, k, 2 * k, v, eps, confidence)
    assert best is not None
    return best


# ---------------------------------------------------------------------------------------------------------------
# the configuration
class CanaryConfig(StrictModel):
    """The canaries: ``white_box`` Dirac gradient canaries and ``black_box`` mislabelled input canaries."""

    white_box: int = Field(2000, ge=0)
    black_box: int = Field(300, ge=0)
    coordinates: Literal["quiet", "random"] = "quiet"


class DPAuditConfig(StrictModel):
    """One-run DP-SGD audit (see examples/privacy_dp_audit.toml).

    Args:
        name: the run's name; seed: data order, canary choice, S and noise.
        data / model: the training data and the architecture (Opacus-compatible: no batch norm).
        target_epsilon / noise_multiplier: the claim (one of them); delta: δ (None: 1/(10 N)).
        accountant: the Opacus accountant the claimed ε is computed with (rdp, prv, gdp).
        epochs / batch_size / lr / momentum / max_grad_norm: DP-SGD (Poisson sampling at rate 1/⌈N/batch⌉).
        canaries: the canary sets; guesses: the k values of the abstaining guesser (k₊ = k₋ = k).
        confidence: of the lower bound (default 95 %).
        noise_divisor: train with σ / noise_divisor while the claim keeps σ (1 = an honest run).

    Returns:
        A strict config for :func:`run_dp_audit`.

    Example:
        >>> DPAuditConfig().target_epsilon, DPAuditConfig().canaries.white_box
        (4.0, 2000)
    """

    name: str = "dp-audit"
    seed: int = 0
    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelConfig = Field(default_factory=lambda: ModelConfig(arch="mlp", hidden=[128], batch_norm=False))
    target_epsilon: float | None = Field(4.0, gt=0.0)
    noise_multiplier: float | None = Field(None, gt=0.0)
    delta: float | None = Field(None, gt=0.0, lt=1.0)
    accountant: Accountant = "rdp"
    # full-batch DP-SGD by default (batch ≥ N → rate 1): the sum-of-gradients score is then the optimal test, the
    # one-run audit is at its tightest (subsampling's amplification is what one run cannot see; §7 of the paper)
    epochs: int = Field(50, ge=1)
    batch_size: int = Field(4096, ge=1)
    lr: float = Field(2.0, gt=0.0)
    momentum: float = Field(0.0, ge=0.0, lt=1.0)
    max_grad_norm: float = Field(1.0, gt=0.0)
    canaries: CanaryConfig = Field(default_factory=CanaryConfig)
    guesses: list[int] = Field(default_factory=lambda: [200, 400, 600, 800])
    confidence: float = Field(0.95, gt=0.5, lt=1.0)
    noise_divisor: float = Field(1.0, ge=1.0)

    @model_validator(mode="after")
    def _claim(self) -> DPAuditConfig:
        if (self.target_epsilon is None) == (self.noise_multiplier is None):
            raise ValueError("give exactly one of target_epsilon (σ found for it) or noise_multiplier")
        if self.canaries.white_box == 0 and self.canaries.black_box == 0:
            raise ValueError("canaries: set white_box and/or black_box > 0")
        if not self.guesses:
            raise ValueError("guesses: list at least one k, e.g. [50, 100]")
        return self


@dataclass(frozen=True)
class DPAuditRow:
    """One canary set's audit: claimed ε (accountant named) vs audited ε lower bound at ``confidence``."""

    variant: str
    m: int
    k: int
    guesses: int
    correct: int
    epsilon_lb: float
    confidence: float
    claimed_epsilon: float
    delta: float
    accountant: str
    claimed_noise_multiplier: float
    trained_noise_multiplier: float
    trained_noise_epsilon: float
    sample_rate: float
    steps: int
    test_accuracy: float
    seed: int

    @property
    def consistent(self) -> bool:
        """True when the audit found no contradiction (ε_lb ≤ claimed ε)."""
        return self.epsilon_lb <= self.claimed_epsilon

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"consistent": self.consistent}

    def text(self) -> str:
        verdict = "consistent" if self.consistent else "CLAIM VIOLATED"
        return (f"{self.variant}: claimed ε = {self.claimed_epsilon:.3g} at δ = {self.delta:.2g} ({self.accountant} "
                f"accountant) vs audited ε ≥ {self.epsilon_lb:.3g} ({self.confidence:.0%}; {self.correct}/"
                f"{self.guesses} right guesses, m = {self.m}) — {verdict}")


# ---------------------------------------------------------------------------------------------------------------
# the training run
def _quiet_coordinates(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, count: int,
                       gen: torch.Generator) -> np.ndarray:
    """The ``count`` parameter coordinates with the smallest mean squared clipped per-example gradient at
    initialisation (ties at random): where the real data disturbs a Dirac canary least. Uses the data, never S."""
    from torch.func import functional_call, grad, vmap

    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss(p: dict[str, torch.Tensor], xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(functional_call(model, p, (xb[None],)), yb[None])

    total = torch.zeros(sum(v.numel() for v in params.values()))
    for i in range(0, len(x), 256):
        g = vmap(grad(loss), in_dims=(None, 0, 0))(params, x[i:i + 256], y[i:i + 256])
        flat = torch.cat([g[k].reshape(len(x[i:i + 256]), -1) for k in params], dim=1)
        flat = flat * (1.0 / flat.norm(dim=1, keepdim=True).clamp_min(1e-12)).clamp(max=1.0)  # clip to norm 1
        total += flat.pow(2).sum(0)
    jitter = torch.rand(total.shape, generator=gen) * 1e-12
    return torch.argsort(total + jitter)[:count].numpy()


class _DiracCanaries:
    """Adds included canaries' Dirac gradients C·e_j to Opacus' clipped sum (before the noise) and records the
    noisy summed gradient at every canary coordinate (the white-box transcript)."""

    def __init__(self, optimizer: Any, coords: np.ndarray, included: np.ndarray, rate: float, clip: float,
                 gen: torch.Generator) -> None:
        self.params = list(optimizer.params)
        sizes = np.cumsum([0] + [p.numel() for p in self.params])
        self.where = []  # per parameter: (canary ids, local flat indices)
        for i in range(len(self.params)):
            sel = np.nonzero((coords >= sizes[i]) & (coords < sizes[i + 1]))[0]
            self.where.append((torch.as_tensor(sel), torch.as_tensor(coords[sel] - sizes[i])))
        self.included = torch.as_tensor(included)
        self.rate, self.clip, self.gen = rate, clip, gen
        self.scores = torch.zeros(len(coords), dtype=torch.float64)
        self.sampled_count = torch.zeros(len(coords), dtype=torch.int64)
        clip_and_accumulate, add_noise = optimizer.clip_and_accumulate, optimizer.add_noise

        def clip_accumulate_and_add_canaries() -> None:
            clip_and_accumulate()
            drawn = (torch.rand(len(self.included), generator=self.gen) < self.rate) & self.included
            self.sampled_count += drawn
            for p, (ids, local) in zip(self.params, self.where, strict=True):
                if len(ids):
                    p.summed_grad.view(-1)[local] += self.clip * drawn[ids].to(p.summed_grad.dtype)

        def add_noise_and_record() -> None:
            add_noise()
            for p, (ids, local) in zip(self.params, self.where, strict=True):
                if len(ids):
                    self.scores[ids] += p.grad.detach().reshape(-1)[local].double()

        optimizer.clip_and_accumulate = clip_accumulate_and_add_canaries
        optimizer.add_noise = add_noise_and_record


def run_dp_audit(cfg: DPAuditConfig, out_dir: str | Path | None = None) -> list[DPAuditRow]:
    """Train once with DP-SGD (Opacus) and the canaries; audit the claim with each canary set.

    Args:
        cfg: :class:`DPAuditConfig`.
        out_dir: if given, write ``results.csv/md/json`` and the canary arrays
            (``canaries_<variant>.scores.npy`` / ``.members.npy``) there.

    Returns:
        one :class:`DPAuditRow` per canary set (``white-box`` and/or ``black-box``).

    Example:
        >>> rows = run_dp_audit(DPAuditConfig(target_epsilon=4.0))  # doctest: +SKIP
        >>> rows[0].text()  # 'white-box: claimed ε = 4 at δ = 7e-05 (rdp accountant) vs audited ε ≥ 1.2 …'  # doctest: +SKIP
    """
    from opacus import PrivacyEngine
    from opacus.validators import ModuleValidator

    data = load_data(cfg.data)
    x, y = data.x_train, data.y_train
    rng = np.random.default_rng(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    # black-box canaries: real training examples given a random wrong label, each included with probability ½
    mb = cfg.canaries.black_box
    if mb >= len(x):
        raise ConfigError(f"canaries.black_box = {mb} must be smaller than the {len(x)} training examples")
    perm = rng.permutation(len(x))
    canary_idx, base_idx = perm[:mb], perm[mb:]
    x_can = x[canary_idx]
    y_can = (y[canary_idx] + torch.as_tensor(rng.integers(1, data.num_classes, mb))) % data.num_classes
    in_bb = rng.random(mb) < 0.5
    x_tr = torch.cat([x[base_idx], x_can[torch.as_tensor(in_bb)]])
    y_tr = torch.cat([y[base_idx], y_can[torch.as_tensor(in_bb)]])
    n = len(x_tr)
    delta = cfg.delta if cfg.delta is not None else default_delta(n)
    batch = min(cfg.batch_size, n)
    rate = 1.0 / math.ceil(n / batch)  # Opacus' Poisson rate: 1 / len(data loader)
    sigma = cfg.noise_multiplier if cfg.noise_multiplier is not None else noise_for_epsilon(
        cfg.target_epsilon or 0.0, delta, rate, cfg.epochs, cfg.accountant)
    sigma_used = sigma / cfg.noise_divisor

    # the model's init and Opacus' own global draws from cfg.seed, without a trace on the caller's global RNG
    with seeded(cfg.seed, numpy=False, python=False):
        model = build_model(cfg.model, data.input_shape, data.num_classes)
        errors = ModuleValidator.validate(model, strict=False)
        if errors:
            raise ConfigError(f"Opacus cannot train this model: {errors[0]} (set model.batch_norm = false)")
        mw = cfg.canaries.white_box
        n_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
        if mw > n_params:
            raise ConfigError(f"canaries.white_box = {mw} exceeds the model's {n_params} parameters")
        # quiet coordinates from the non-canary data only: a choice that saw the black-box canaries would let their
        # inclusion reach the training outside the DP mechanism (and void the black-box audit)
        coords = (_quiet_coordinates(model, x[base_idx], y[base_idx], mw, gen) if cfg.canaries.coordinates == "quiet"
                  else rng.choice(n_params, mw, replace=False))
        in_wb = rng.random(mw) < 0.5

        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x_tr, y_tr), batch_size=batch,
                                             shuffle=True, generator=torch.Generator().manual_seed(cfg.seed + 1))
        opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Opacus warns that secure_mode is off: we want seeded, repeatable runs
            engine = PrivacyEngine(accountant=cfg.accountant)
            private, opt, loader = engine.make_private(
                module=model, optimizer=opt, data_loader=loader, noise_multiplier=sigma_used,
                max_grad_norm=cfg.max_grad_norm, poisson_sampling=True,
                noise_generator=torch.Generator().manual_seed(cfg.seed + 2))
            canaries = _DiracCanaries(opt, coords, in_wb, rate, cfg.max_grad_norm,
                                      torch.Generator().manual_seed(cfg.seed + 3)) if mw else None
            private.train()
            for _ in range(cfg.epochs):
                for xb, yb in loader:
                    if len(xb) == 0:  # an empty Poisson batch (probability (1 − q)^N): nothing released
                        continue
                    loss = F.cross_entropy(private(xb), yb)
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    opt.step()
            steps = sum(h[2] for h in engine.accountant.history)
            trained_eps = float(engine.get_epsilon(delta))
        private.remove_hooks()
    model.eval()
    claimed = epsilon_spent(sigma, rate, steps, delta, cfg.accountant)
    with torch.no_grad():
        test_acc = float((model(data.x_test).argmax(1) == data.y_test).float().mean())
    common = {"confidence": cfg.confidence, "claimed_epsilon": claimed, "delta": delta,
              "accountant": cfg.accountant, "claimed_noise_multiplier": float(sigma),
              "trained_noise_multiplier": float(sigma_used), "trained_noise_epsilon": trained_eps,
              "sample_rate": rate, "steps": int(steps), "test_accuracy": test_acc, "seed": cfg.seed}
    sets: list[tuple[str, np.ndarray, np.ndarray]] = []
    if canaries is not None:
        sets.append(("white-box", canaries.scores.numpy(), in_wb))
    if mb:
        with torch.no_grad():
            bb_scores = -F.cross_entropy(model(x_can), y_can, reduction="none").double().numpy()
        sets.append(("black-box", bb_scores, in_bb))
    rows = []
    for variant, scores, inc in sets:
        ks = sorted({max(1, min(k, len(scores) // 2)) for k in cfg.guesses})  # a small set: k up to m/2
        g = audit_scores(scores, inc, delta, ks, cfg.confidence)
        rows.append(DPAuditRow(variant=variant, m=g.m, k=g.k, guesses=g.r, correct=g.v, epsilon_lb=g.epsilon_lb,
                               **common))
    if out_dir is not None:
        _write(cfg, Path(out_dir), rows, sets)
    return rows


COLUMNS = ["variant", "claimed_epsilon", "accountant", "delta", "epsilon_lb", "confidence", "consistent", "m", "k",
           "guesses", "correct", "claimed_noise_multiplier", "trained_noise_multiplier", "steps", "sample_rate",
           "test_accuracy", "seed"]


def _write(cfg: DPAuditConfig, out: Path, rows: list[DPAuditRow],
           sets: list[tuple[str, np.ndarray, np.ndarray]]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    dump_config(cfg, out / "config.json")
    for variant, scores, inc in sets:
        save_scores(out / "canaries", variant, scores, inc)
    notes = ["claimed ε: the named Opacus accountant for the claimed noise multiplier; ε_lb: Steinke, Nasr & "
             "Jagielski (2023) Theorem 5.2 / App. D for the abstaining guesser (top-k in, bottom-k out), Bonferroni "
             f"over k ∈ {sorted(set(cfg.guesses))}; consistent: ε_lb ≤ claimed ε"]
    if cfg.noise_divisor != 1:
        notes.append(f"BROKEN RUN (on purpose): trained with σ / {cfg.noise_divisor:g} while the claim keeps σ")
    write_table(out, "results", [r.as_dict() for r in rows], COLUMNS, title=f"{cfg.name}: one-run DP audit",
                notes=notes)
