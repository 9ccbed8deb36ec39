"""Input-leakage audit: train Alice | Bob in process as the parties do, let Bob reconstruct Alice's inputs.

The other direction of :mod:`.study` (labels to Alice). For each setting of Alice's ``[input_protection]`` (noise σ,
NoPeek α) and each seed, the training set is split into Alice's private rows and a disjoint public part that Bob
uses as auxiliary data (``aux_fraction``). Then:

- **honest-but-curious Bob** trains his part on Alice's activations exactly as the party does (his default
  ``[label_protection]`` included), keeps the last activation he received for each private row, and runs
  :func:`~.inversion.decoder_attack` (He et al. 2019) and :func:`~.inversion.unsplit_attack` (UnSplit) on them;
- **hijacking Bob** (:class:`~.inversion.FSHAServer`, Pasquini et al. 2021) answers every step with his adversarial
  gradient instead, for the same number of steps, and inverts the last activations with his pilot decoder.

Alice's side is the party's own code (:class:`~modelward.governance.party.input_protection.InputProtection`: the
same keyed noise and NoPeek term), so the accuracy cost measured here is the deployed one. Every reconstruction is
scored by :func:`~.inversion.reconstruction_scores` (SSIM for images, MSE) next to the no-leak references of
:func:`~.inversion.baselines`.

Example:
    >>> row = simulate_inputs(load_data(DataConfig(source="digits")), ModelConfig(), "conv1",
    ...                       TrainConfig(steps=200), InputProtectionConfig(noise=0.5), InputAuditSettings(), 0)
    ... # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field, field_validator
from torch import nn

from modelward.core.config import StrictModel
from modelward.core.data import DataSplit
from modelward.core.init import init_model_
from modelward.core.train import TrainConfig, batch_order, make_optimizer
from modelward.core.zoo import ModelConfig, build_model
from modelward.governance.leakage.attacks import auc
from modelward.governance.leakage.inversion import (
    FSHAServer,
    FSHASettings,
    baselines,
    decoder_attack,
    reconstruction_scores,
    unsplit_attack,
)
from modelward.governance.party.config import DEFAULT_LABEL_PROTECTION
from modelward.governance.party.input_protection import InputProtection, InputProtectionConfig
from modelward.governance.party.label_protection import LabelProtectionConfig, protect_gradient
from modelward.governance.plan import SplitPlan, make_plan, model_layers, segment_of

InputAttack = Literal["decoder", "unsplit", "fsha"]
ATTACK_SEED = 982_451_653  # offsets the attacker's seeds from the ones that initialise Alice


class InputAuditSettings(StrictModel):
    """``[inputs]``: the input-reconstruction part of ``modelward split audit-leakage``.

    Args:
        attacks: which attacks run (``[]``: none; the label sweep alone).
        defenses: Alice's ``[input_protection]`` settings to compare (``{noise, nopeek}`` each; the first should
            be the unprotected one).
        seeds: one training per defense and seed (and one hijacked training when ``fsha`` runs).
        aux_fraction: the share of the training set that is public (Bob's auxiliary data; Alice trains on the
            rest).
        rows: private rows reconstructed per run (the last activation Bob received for each).
        canaries: public rows (from the auxiliary part, labels public too) mixed into the training, on which Alice
            computes what a label-aware hijacking detector would (``canary_auc``: do her gradients of same-label
            canaries point more alike than of different-label ones? — the Gradient Scrutinizer's test).
        label_protection: Bob's protection while he trains honestly (default: the party's default, Marvell 4).
        surrogate_steps / decoder_steps / unsplit_rounds: the honest-but-curious attacks' main knobs (see
            ``inversion``).
        fsha_grad_scales: the factors the hijacker puts on the gradient he returns (he chooses Alice's effective
            step size); one hijacked training per factor, reported as ``fsha`` (the first) and ``fsha_x<factor>``.
    """

    attacks: list[InputAttack] = Field(default_factory=lambda: ["decoder", "unsplit", "fsha"])
    defenses: list[InputProtectionConfig] = Field(default_factory=lambda: [
        InputProtectionConfig(), InputProtectionConfig(noise=0.5), InputProtectionConfig(noise=1.0),
        InputProtectionConfig(nopeek=0.5)])
    seeds: list[int] = Field(default_factory=lambda: [0])
    aux_fraction: float = Field(0.3, gt=0.0, lt=1.0)
    rows: int = Field(256, ge=8)
    canaries: int = Field(100, ge=0)
    label_protection: LabelProtectionConfig = Field(default_factory=lambda: DEFAULT_LABEL_PROTECTION)
    surrogate_steps: int = Field(1500, ge=0)
    decoder_steps: int = Field(1500, ge=1)
    unsplit_rounds: int = Field(60, ge=1)
    fsha_grad_scales: list[float] = Field(default_factory=lambda: [0.01])

    @field_validator("fsha_grad_scales")
    @classmethod
    def _scales(cls, v: list[float]) -> list[float]:
        if not v or min(v) <= 0:
            raise ValueError("give one or more positive factors, e.g. [0.01, 0.1]")
        return v

    @field_validator("defenses")
    @classmethod
    def _defenses(cls, v: list[InputProtectionConfig]) -> list[InputProtectionConfig]:
        if any(d.seed is not None for d in v):
            raise ValueError("inputs.defenses: leave seed unset (the audit keys Alice's noise per run)")
        return v


def defense_label(d: InputProtectionConfig) -> str:
    """``none``, ``noise 0.5``, ``nopeek 0.5`` or ``noise 0.5 + nopeek 0.5``: one defense, for tables and ids."""
    parts = [f"noise {d.noise:g}"] * (d.noise > 0) + [f"nopeek {d.nopeek:g}"] * (d.nopeek > 0)
    return " + ".join(parts) or "none"


def split_rows(n: int, aux_fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(Alice's private rows, Bob's auxiliary rows) of a training set of `n` rows, disjoint, seeded."""
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(10_007 + seed))
    n_aux = max(1, int(round(aux_fraction * n)))
    return perm[n_aux:].sort().values, perm[:n_aux].sort().values


@dataclass
class Trained:
    """A simulated training: the parts, what Bob received, and what Alice could see of Bob's gradients."""

    plan: SplitPlan
    alice: nn.Module
    bob: nn.Module
    last: dict[int, torch.Tensor]  # private row (position) -> the last activation Bob received for it
    protect: InputProtection
    canary_auc: float  # same-label vs other-label cosine AUC of the canaries' epoch-averaged gradients
    grad_norm: float  # mean row norm of the gradients Alice received over the last tenth of the steps


def _train(data: DataSplit, model_cfg: ModelConfig, cut: str | None, train_cfg: TrainConfig,
           defense: InputProtectionConfig, label_protection: LabelProtectionConfig, private: torch.Tensor,
           canaries: torch.Tensor, seed: int, hijacker: FSHAServer | None = None,
           init: str = "glorot_uniform") -> Trained:
    """Train the split on Alice's private rows and the public canary rows (Bob honest, or `hijacker`)."""
    model = init_model_(build_model(model_cfg, data.input_shape, data.num_classes), init, seed)
    plan = make_plan(model, ["alice", "bob"], [cut or model_layers(model)[0].name])
    alice, bob = segment_of(model, plan.owners["alice"], "alice"), segment_of(model, plan.owners["bob"], "bob")
    opt_a = make_optimizer(list(alice.parameters()), train_cfg)
    opt_b = make_optimizer(list(bob.parameters()), train_cfg)
    protect = InputProtection(defense.model_copy(update={"seed": 7919 + seed}))
    noise = torch.Generator().manual_seed(seed + 104_729)
    rows = torch.cat([private, canaries])
    x, y = data.x_train[rows], data.y_train[rows]
    batches = batch_order(len(rows), train_cfg.batch_size, seed)
    last: dict[int, torch.Tensor] = {}
    seen: dict[int, torch.Tensor] = {}  # canary position -> sum of its normalised gradients (Alice knows its label)
    norms: list[float] = []
    model.train()
    for step in range(train_cfg.steps):
        idx = next(batches)
        for opt in (opt_a, opt_b):
            for group in opt.param_groups:
                group["lr"] = train_cfg.lr_at(step)
        h = alice(x[idx])
        sent = protect.outgoing(h, x[idx], step)                      # what crosses the cut
        if hijacker is None:                                          # Bob trains his part on his labels
            hb = sent.detach().requires_grad_(True)
            loss = F.cross_entropy(bob(hb), y[idx])
            opt_b.zero_grad(set_to_none=True)
            loss.backward()
            g = protect_gradient(hb.grad, y[idx], label_protection, generator=noise)
            opt_b.step()
        else:                                                         # Bob steers Alice's part instead
            g = hijacker.step(sent)
        flat = g.detach().reshape(len(idx), -1)
        norms.append(float(flat.norm(dim=1).mean()))
        for j, i in enumerate(idx.tolist()):
            if i < len(private):
                last[i] = sent[j].detach()
            else:
                seen[i] = seen.get(i, 0) + F.normalize(flat[j], dim=0)
        opt_a.zero_grad(set_to_none=True)
        h.backward(protect.incoming(g, step))
        opt_a.step()
    keys = sorted(seen)
    canary_auc = float("nan")
    if len(keys) > 2:
        gn = F.normalize(torch.stack([seen[k] for k in keys]).double(), dim=1)
        yc = y[keys]
        iu = torch.triu_indices(len(keys), len(keys), 1)
        canary_auc = auc((gn @ gn.T)[iu[0], iu[1]].numpy(), (yc[:, None] == yc[None, :])[iu[0], iu[1]].numpy())
    tail = norms[-max(1, len(norms) // 10):]
    return Trained(plan, alice, bob, last, protect, canary_auc, sum(tail) / len(tail))


def _accuracy(alice, bob, protect: InputProtection, data: DataSplit) -> float:
    """Test accuracy as the parties evaluate: Alice's activation (with her noise) through Bob's part."""
    alice.eval()
    bob.eval()
    right = 0
    with torch.no_grad():
        for i in range(0, len(data.x_test), 512):
            xb = data.x_test[i:i + 512]
            right += int((bob(protect.outgoing(alice(xb), xb)).argmax(1) == data.y_test[i:i + 512]).sum())
    return right / len(data.x_test)


def simulate_inputs(data: DataSplit, model_cfg: ModelConfig, cut: str | None, train_cfg: TrainConfig,
                    defense: InputProtectionConfig, settings: InputAuditSettings, seed: int,
                    init: str = "glorot_uniform", keep: int = 0) -> dict:
    """One run: honest training with Alice's `defense` and Bob's attacks on what he received; then, if ``fsha``
    is among the attacks, a hijacked training with the same defense.

    Args:
        data: the data set (images in [0, 1] are scored with SSIM too).
        model_cfg / cut / train_cfg / init: the split model and its training, as in the label audit.
        defense: Alice's ``[input_protection]``.
        settings: the ``[inputs]`` table.
        seed: model initialisation, data order, the public/private split and the attacks' randomness.
        keep: return this many rows' inputs and reconstructions (``"examples"``, for the figure).

    Returns:
        ``test_accuracy`` (honest training with the defense) and, per attack, ``<attack>_ssim`` /
        ``<attack>_mse`` and its baselines ``<attack>_other_ssim`` / ``..._mse``, plus ``mean_ssim`` /
        ``mean_mse`` (the auxiliary mean image).
    """
    images = data.is_image and data.x_train.dim() == 4
    private, aux = split_rows(len(data.x_train), settings.aux_fraction, seed)
    aux_x, aux_y = data.x_train[aux], data.y_train[aux]
    canaries = aux[:settings.canaries]
    pick = torch.randperm(len(private), generator=torch.Generator().manual_seed(seed))[:settings.rows].sort().values
    out: dict = {}
    examples: dict[str, torch.Tensor] = {}
    honest = [a for a in settings.attacks if a != "fsha"]
    run = _train(data, model_cfg, cut, train_cfg, defense, settings.label_protection, private, canaries, seed,
                 init=init)
    out["test_accuracy"] = _accuracy(run.alice, run.bob, run.protect, data)
    out["honest_canary_auc"], out["honest_grad_norm"] = run.canary_auc, run.grad_norm
    x_true = data.x_train[private][pick]
    received = torch.stack([run.last[int(i)] for i in pick])
    bob = run.bob

    def builder():
        return segment_of(build_model(model_cfg, data.input_shape, data.num_classes), run.plan.owners["alice"],
                          "alice")

    # Bob's own randomness, unrelated to Alice's initialisation (torch's uniform stream under the same seed would
    # start his surrogates as a scaled copy of her initial weights: in a deployment hers come from her CSPRNG)
    rng = ATTACK_SEED + seed
    base = baselines(x_true, aux_x, x_true, images, seed=seed)  # (the "other" half is per attack, below)
    out |= {k: v for k, v in base.items() if k.startswith("mean_")}
    examples["input"] = x_true[:keep]
    examples["aux mean"] = aux_x.mean(0, keepdim=True).expand(max(keep, 1), *aux_x.shape[1:])[:keep]
    for attack in honest:
        if attack == "decoder":
            x_hat = decoder_attack(builder, bob, aux_x, aux_y, received, images,
                                   surrogate_steps=settings.surrogate_steps, decoder_steps=settings.decoder_steps,
                                   sigma=defense.noise, seed=rng)
        else:
            x_hat = torch.cat([unsplit_attack(builder, received[i:i + 128], aux_x.mean(0, keepdim=True), images,
                                              rounds=settings.unsplit_rounds, seed=rng)
                               for i in range(0, len(received), 128)])
        _score(out, attack, x_true, x_hat, aux_x, images, seed)
        examples[attack] = x_hat[:keep]
    for k, scale in enumerate(settings.fsha_grad_scales if "fsha" in settings.attacks else []):
        name = "fsha" if k == 0 else f"fsha_x{scale:g}"
        hijacker = FSHAServer(builder, aux_x, tuple(received.shape[1:]), images, FSHASettings(grad_scale=scale),
                              seed=rng)
        hijacked = _train(data, model_cfg, cut, train_cfg, defense, settings.label_protection, private, canaries,
                          seed, hijacker=hijacker, init=init)
        x_hat = hijacker.reconstruct(torch.stack([hijacked.last[int(i)] for i in pick]))
        _score(out, name, x_true, x_hat, aux_x, images, seed)
        out[f"{name}_canary_auc"], out[f"{name}_grad_norm"] = hijacked.canary_auc, hijacked.grad_norm
        examples[name] = x_hat[:keep]
    if keep:
        out["examples"] = {k: v.detach().float().tolist() for k, v in examples.items()}
    return out


def _score(out: dict, attack: str, x: torch.Tensor, x_hat: torch.Tensor, aux_x: torch.Tensor, images: bool,
           seed: int) -> None:
    s = reconstruction_scores(x, x_hat, images)
    b = baselines(x, aux_x, x_hat, images, seed=seed)
    out[f"{attack}_mse"], out[f"{attack}_other_mse"] = s["mse"], b["other_mse"]
    if images:
        out[f"{attack}_ssim"], out[f"{attack}_other_ssim"] = s["ssim"], b["other_ssim"]


def reconstructions_plot(path: Path, examples: dict[str, list], title: str) -> Path | None:
    """One row per source (the inputs, the auxiliary mean, each attack), one column per private row; images only."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    first = [k for k in ("input", "aux mean") if k in examples]  # (the run's record may come back key-sorted)
    rows = {k: torch.tensor(examples[k]) for k in [*first, *sorted(set(examples) - set(first))] if len(examples[k])}
    if not rows or next(iter(rows.values())).dim() != 4:
        return None
    n = next(iter(rows.values())).shape[0]
    fig, axes = plt.subplots(len(rows), n, figsize=(0.9 * n + 1.2, 0.95 * len(rows) + 0.5), squeeze=False)
    for r, (name, imgs) in enumerate(rows.items()):
        for c in range(n):
            ax = axes[r][c]
            ax.imshow(imgs[c].permute(1, 2, 0).squeeze(-1).clamp(0, 1).numpy(), cmap="gray", vmin=0, vmax=1)
            ax.set_xticks([])
            ax.set_yticks([])
            if c == 0:
                ax.set_ylabel(name, fontsize=8, rotation=0, ha="right", va="center")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
