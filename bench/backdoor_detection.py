"""Backdoor detection (issue 41): many seeded clean and backdoored models per data set, modelward's detectors and
ART's implementations side by side on the same models.

    nice -n 10 .venv/bin/python bench/backdoor_detection.py [--out runs/bench/backdoor] [--seeds 10]
        [--datasets digits,rgb] [--attacks badnets,blend,wanet,clean_label] [--no-art] [--threads 1]
        [--calibration-seeds 10]

Data sets (seeded, nothing downloaded): ``digits`` (scikit-learn's 8×8 digits, 1×8×8 in [0, 1]) and ``rgb`` (the
project's synthetic RGB images: 10 classes, 3×16×16, 3,000 images; ``synthetic_images``). Model: the zoo CNN
(conv 16–32, fc 64), 600 SGD steps. Per data set, ``--seeds`` clean models and ``--seeds`` backdoored models of each
attack (target class = seed mod 10): BadNets (a 2×2 / 3×3 checker patch), Blend (α = 0.15 noise), WaNet (k = 4,
s = 2, noise mode ×2) at 5 % poisoned rows, and a clean-label attack (Turner et al.: PGD ε = 0.3 / 0.5 against a
surrogate, corner patches) on 8 % of the rows (the target class's rows only).

The study runs through the ledger (``modelward.backdoor.study``): interrupted, it resumes with the models not yet
done; the models are kept (``models/``) and ART's runs (``art|<run>``) read them, so ART can be added to a finished
study. ART (``adversarial-robustness-toolbox``, installed by ``make bench`` with ``--no-deps``) is called as its
documentation shows, on a ``PyTorchClassifier`` around the same weights (the CNN as an ``nn.Sequential``, which ART's
layer access needs):

- ``ActivationDefence`` (PCA to 10 dims, 2 clusters, ``cluster_analysis="smaller"``): suspected rows;
- ``SpectralSignatureDefense`` (``expected_pp_poison`` = the scan's ε, ``eps_multiplier`` 1.5): suspected rows, and
  ART's own per-row scores (``spectral_signature_scores`` on the activations it reads) for the AUC;
- ``STRIP`` (20 samples, ``false_acceptance_rate`` = the same FRR target): its abstentions on clean and triggered
  inputs;
- Neural Cleanse: ART ships it for Keras/TensorFlow only (``art.estimators.poison_mitigation.NeuralCleanseKeras``),
  which cannot run beside this project's PyTorch. ``ArtNeuralCleanseTorch`` below is ART's ``NeuralCleanseMixin``
  (its outlier test and its loop, unchanged) with the Keras training step transcribed to PyTorch line by line, at
  ART's defaults except the epoch count (40, as ours; ART's default is 1,000).

Detection is counted twice: at the papers' thresholds (anomaly index > 2, p < 0.05), and at thresholds calibrated
on ``--calibration-seeds`` *other* clean models per data set (seeds 100, 101, ...; ``<out>/calibration``): each
detector's threshold is the largest statistic it gave there, an expected false-positive rate of 1/(n + 1)
(``modelward.backdoor.study.calibrated_tables``).

Writes ``summary_*.csv/md/json`` (modelward), ``calibrated.*``, ``art_*.csv/md/json`` (side by side) and prints
them.
"""

from __future__ import annotations

import argparse
import logging
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from modelward.backdoor.detect.data.base import roc_auc
from modelward.backdoor.detect.model.neural_cleanse import anomaly_index
from modelward.backdoor.experiment import AttackSpec, box_of, build_attack, defender_split, detect_model
from modelward.backdoor.study import (
    BackdoorStudy,
    BackdoorStudyConfig,
    DatasetSpec,
    calibrated_tables,
    execute_run,
    run_config,
    run_folder,
)
from modelward.core.data import DataConfig, load_data
from modelward.core.io import load_state_dict
from modelward.core.progress import RichProgress
from modelward.core.records import write_table
from modelward.core.runner import RunSpec
from modelward.core.study import StudyContext, run_study
from modelward.core.train import TrainConfig
from modelward.core.zoo import ModelConfig, build_model

ROOT = Path(__file__).resolve().parents[1]
log = logging.getLogger("backdoor_detection")
MODEL = ModelConfig(arch="cnn", channels=[16, 32], fc=64)
TRAIN = TrainConfig(steps=600, eval_every=600)
RATE = 0.05
ATTACKS = {
    "digits": [AttackSpec(name="badnets", rate=RATE, params={"size": 2}),
               AttackSpec(name="blend", rate=RATE, params={"alpha": 0.15}),
               AttackSpec(name="wanet", rate=RATE, params={"strength": 2.0}),
               AttackSpec(name="clean_label", rate=0.08, params={"eps": 0.3, "size": 3})],
    "rgb": [AttackSpec(name="badnets", rate=RATE, params={"size": 3}),
            AttackSpec(name="blend", rate=RATE, params={"alpha": 0.15}),
            AttackSpec(name="wanet", rate=RATE, params={"strength": 2.0}),
            AttackSpec(name="clean_label", rate=0.08, params={"eps": 0.5, "size": 3})],
}
DATA = {"digits": DataConfig(source="digits"),
        "rgb": DataConfig(source="synthetic_images", channels=3, image_size=16, n_samples=3000)}


def study_config(datasets: list[str], attacks: list[str], seeds: int, threads: int,
                 clean_seeds: list[int] | None = None) -> BackdoorStudyConfig:
    return BackdoorStudyConfig(
        datasets=[DatasetSpec(name=d, data=DATA[d], model=MODEL, train=TRAIN,
                              attacks=[a for a in ATTACKS[d] if a.name in attacks]) for d in datasets],
        clean_seeds=clean_seeds if clean_seeds is not None else list(range(seeds)),
        attack_seeds=[] if clean_seeds is not None else list(range(seeds)), save_models=clean_seeds is None,
        threads=threads)


# ----------------------------------------------------------------------------------------------------------- ART
def sequential_view(model: nn.Module, softmax: bool = False) -> nn.Sequential:
    """The zoo CNN as an ``nn.Sequential`` of the same modules (ART's PyTorch wrapper calls the top-level modules
    in order); ``softmax``: probabilities out (ART's STRIP takes the entropy of the classifier's predictions)."""
    convs = [getattr(model, f"conv{i}") for i in range(1, model.n_conv + 1)]
    tail = [nn.Softmax(dim=1)] if softmax else []
    return nn.Sequential(*convs, nn.Flatten(), model.fc1, nn.ReLU(), model.logits, *tail).eval()


def art_classifier(model: nn.Module, input_shape: tuple[int, ...], num_classes: int,
                   clip: tuple[float, float], softmax: bool = False) -> Any:
    from art.estimators.classification import PyTorchClassifier

    return PyTorchClassifier(sequential_view(model, softmax), loss=nn.CrossEntropyLoss(), input_shape=input_shape,
                             nb_classes=num_classes, clip_values=clip, device_type="cpu")


def art_neural_cleanse_class() -> type:
    """ART's NeuralCleanseMixin on a PyTorchClassifier, its Keras ``train_step`` / ``reset`` transcribed."""
    from art.estimators.classification import PyTorchClassifier
    from art.estimators.poison_mitigation.neural_cleanse.neural_cleanse import NeuralCleanseMixin
    from tqdm.auto import tqdm

    class ArtNeuralCleanseTorch(NeuralCleanseMixin, PyTorchClassifier):  # type: ignore[misc]
        def __init__(self, model: nn.Module, input_shape: tuple[int, ...], nb_classes: int,
                     clip_values: tuple[float, float], steps: int, **kw: Any) -> None:
            super().__init__(model=model, loss=nn.CrossEntropyLoss(), input_shape=input_shape, nb_classes=nb_classes,
                             clip_values=clip_values, device_type="cpu", steps=steps, **kw)
            self.norms_seen: list[float] = []
            gen = np.random.default_rng(0)
            self.mask_raw = torch.tensor(gen.uniform(size=input_shape), dtype=torch.float32, requires_grad=True)
            self.pattern_raw = torch.tensor(gen.uniform(size=input_shape), dtype=torch.float32, requires_grad=True)
            self.eps = 1e-7  # keras.backend.epsilon()
            self.cost = self.init_cost
            self.opt = torch.optim.Adam([self.mask_raw, self.pattern_raw], lr=self.learning_rate, betas=(0.5, 0.9))

        def reset(self) -> None:  # keras.py reset(): cost and optimizer state (not the mask: ART keeps it)
            self.cost = self.init_cost
            self.opt = torch.optim.Adam([self.mask_raw, self.pattern_raw], lr=self.learning_rate, betas=(0.5, 0.9))

        def train_step(self, x_batch: np.ndarray, y_batch: np.ndarray) -> tuple[float, float]:
            mask = torch.tanh(self.mask_raw) / (2 - self.eps) + 0.5
            pattern = torch.tanh(self.pattern_raw) / (2 - self.eps) + 0.5
            x = torch.as_tensor(x_batch, dtype=torch.float32)
            x_adv = (1 - mask) * x + mask * pattern
            y_pred = self._model._model(x_adv)  # logits (use_logits=True in the Keras version's terms)
            y = torch.as_tensor(np.argmax(y_batch, axis=1))
            loss_ce = nn.functional.cross_entropy(y_pred, y, reduction="none")
            acc = (y_pred.argmax(1) == y).float().mean()
            if self.norm == 1:
                loss_reg = mask.abs().sum() / mask.shape[0]  # Keras: shape[-1], channels last
            else:
                loss_reg = torch.sqrt((mask ** 2).sum() / mask.shape[0])
            loss = loss_ce.mean() + self.cost * loss_reg
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
            self.mask_tensor, self.pattern_tensor = mask.detach().numpy(), pattern.detach().numpy()
            return float(loss_reg), float(acc)

        def generate_backdoor(self, x_val: np.ndarray, y_val: np.ndarray, y_target: np.ndarray
                              ) -> tuple[np.ndarray, np.ndarray]:
            # keras.py generate_backdoor, with ImageDataGenerator.flow replaced by shuffled batches
            self.reset()
            rng = np.random.default_rng(int(np.argmax(y_target)))
            mask_best = pattern_best = None
            reg_best = float("inf")
            cost_set_counter = cost_up_counter = cost_down_counter = 0
            cost_up_flag = cost_down_flag = False
            early_stop_counter = 0
            early_stop_reg_best = reg_best
            mini_batch_size = len(x_val) // self.batch_size
            for _ in tqdm(range(self.steps), disable=True):
                loss_reg_list, loss_acc_list = [], []
                order = rng.permutation(len(x_val))
                for b in range(mini_batch_size):
                    x_batch = x_val[order[b * self.batch_size:(b + 1) * self.batch_size]]
                    y_batch = np.array([y_target] * x_batch.shape[0])
                    reg, acc = self.train_step(x_batch, y_batch)
                    loss_reg_list.append(reg)
                    loss_acc_list.append(acc)
                avg_loss_reg = np.mean(loss_reg_list)
                avg_loss_acc = np.mean(loss_acc_list)
                if avg_loss_acc >= self.attack_success_threshold and avg_loss_reg < reg_best:
                    mask_best, pattern_best, reg_best = self.mask_tensor, self.pattern_tensor, avg_loss_reg
                if self.early_stop:
                    if reg_best < float("inf"):
                        if reg_best >= self.early_stop_threshold * early_stop_reg_best:
                            early_stop_counter += 1
                        else:
                            early_stop_counter = 0
                    early_stop_reg_best = min(reg_best, early_stop_reg_best)
                    if cost_down_flag and cost_up_flag and early_stop_counter >= self.early_stop_patience:
                        break
                if avg_loss_acc >= self.attack_success_threshold:
                    cost_set_counter += 1
                    if cost_set_counter >= self.patience:
                        self.cost = self.init_cost
                        cost_up_counter = cost_down_counter = 0
                        cost_up_flag = cost_down_flag = False
                else:
                    cost_set_counter = 0
                if avg_loss_acc >= self.attack_success_threshold:
                    cost_up_counter += 1
                    cost_down_counter = 0
                else:
                    cost_up_counter = 0
                    cost_down_counter += 1
                if cost_up_counter >= self.patience:
                    cost_up_counter = 0
                    self.cost *= self.cost_multiplier_up
                    cost_up_flag = True
                elif cost_down_counter >= self.patience:
                    cost_down_counter = 0
                    self.cost /= self.cost_multiplier_down
                    cost_down_flag = True
            if mask_best is None:
                mask_best, pattern_best = self.mask_tensor, self.pattern_tensor
            self.norms_seen.append(float(np.sum(np.abs(mask_best))))
            return mask_best, pattern_best

    return ArtNeuralCleanseTorch


def load_run_model(cfg: BackdoorStudyConfig, out: Path, main_id: str) -> tuple[nn.Module, Any, Any]:
    ds, attack, seed = main_id.split("|")
    rc = run_config(cfg, ds, None if attack == "clean" else attack, int(seed))
    data = load_data(rc.data)
    model = build_model(rc.model, data.input_shape, data.num_classes)
    tensors, _ = load_state_dict(run_folder(out, main_id) / "model.safetensors")
    model.load_state_dict(tensors)
    return model.eval(), data, rc


def art_run(run_id: str, spec: dict[str, Any], deps: dict[str, dict[str, Any]], out: str) -> dict[str, Any]:
    """ART's detectors on one model of the study (its weights and changed rows read from ``models/``)."""
    from art.defences.detector.poison import ActivationDefence, SpectralSignatureDefense
    from art.defences.transformer.poisoning import STRIP as ArtSTRIP

    cfg = BackdoorStudyConfig.model_validate_json(spec["config"])
    main_id = spec["of"]
    model, data, rc = load_run_model(cfg, Path(out), main_id)
    clip = box_of(data)
    seed = int(main_id.split("|")[2])
    (xd, yd), (xe, ye) = defender_split(data, seed)
    k = data.num_classes
    shape = tuple(data.input_shape)
    res: dict[str, Any] = {"art_of": main_id}
    folder = run_folder(out, main_id)
    # Neural Cleanse (ART's mixin, Keras step transcribed)
    nc = art_neural_cleanse_class()(sequential_view(model), shape, k, clip, steps=cfg.detect.neural_cleanse.epochs,
                                    batch_size=cfg.detect.neural_cleanse.batch_size)
    x_nc = xd[: cfg.detect.clean_points].numpy()
    flagged = nc.outlier_detection(x_nc, np.eye(k)[yd[: cfg.detect.clean_points].numpy()])
    ai, suspect = anomaly_index(nc.norms_seen)
    res["neural_cleanse"] = {"statistic": ai, "flagged": bool(flagged), "suspect": suspect,
                             "flagged_classes": [int(f[0]) for f in flagged], "per_class": nc.norms_seen}
    # STRIP
    clf = art_classifier(model, shape, k, clip, softmax=True)
    strip = ArtSTRIP(clf)(num_samples=cfg.strip.n, false_acceptance_rate=cfg.strip.frr)
    np.random.seed(seed)  # ART's STRIP draws its blend partners from numpy's global RNG
    strip.mitigate(xd.numpy())
    abstain = lambda p: (np.abs(p).sum(1) == 0)  # noqa: E731 - ART's abstention is an all-zero row
    res["strip"] = {"frr": float(abstain(strip.predict(xe.numpy())).mean())}
    changed = folder / "changed_rows.npz"
    if changed.is_file():
        with np.load(changed, allow_pickle=False) as f:
            idx, xc, yc = f["index"], f["x"], f["y"]
            truth, target = f["poisoned"].astype(bool), int(f["target"])
        x_tr, y_tr = data.x_train.clone(), data.y_train.clone()
        x_tr[torch.as_tensor(idx)] = torch.as_tensor(xc)
        y_tr[torch.as_tensor(idx)] = torch.as_tensor(yc)
        attack = run_config(cfg, *main_id.split("|")[:2], seed).attack
        # the test-time trigger only (no surrogate needed to stamp it)
        trig = build_attack(attack.model_copy(update={"surrogate_steps": 0}), data, rc.model, rc.train, seed)
        keep = ye != target
        res["strip"]["tpr"] = float(abstain(strip.predict(trig.apply(xe[keep]).numpy())).mean())
        xs, ys = x_tr.numpy(), np.eye(k)[y_tr.numpy()]
        in_target = y_tr.numpy() == target
        clf2 = art_classifier(model, shape, k, clip)
        ac = ActivationDefence(clf2, xs, ys)
        _, clean_ac = ac.detect_poison(nb_clusters=2, nb_dims=10, reduce="PCA", cluster_analysis="smaller")
        sus = np.asarray(clean_ac) == 0
        res["activation_clustering"] = {"auc": roc_auc(sus.astype(float), truth),
                                        "auc_in_target": roc_auc(sus[in_target].astype(float), truth[in_target]),
                                        "true_positives": int((sus & truth).sum()),
                                        "false_positives": int((sus & ~truth).sum())}
        ss = SpectralSignatureDefense(clf2, xs, ys, expected_pp_poison=cfg.scan.epsilon, eps_multiplier=1.5)
        _, clean_ss = ss.detect_poison()
        sus = np.asarray(clean_ss) == 0
        feats = clf2.get_activations(xs, layer=len(clf2.layer_names) - 1, batch_size=128).reshape(len(xs), -1)
        scores = np.zeros(len(xs))
        for c in range(k):
            rows = np.flatnonzero(y_tr.numpy() == c)
            if len(rows):
                scores[rows] = SpectralSignatureDefense.spectral_signature_scores(feats[rows])[:, 0]
        res["spectral_signature"] = {"auc": roc_auc(scores, truth), "auc_in_target": roc_auc(scores[in_target],
                                                                                               truth[in_target]),
                                     "true_positives": int((sus & truth).sum()),
                                     "false_positives": int((sus & ~truth).sum())}
    return res


def bench_execute(run_id: str, spec: dict[str, Any], deps: dict[str, dict[str, Any]], out: str) -> dict[str, Any]:
    if run_id.startswith("art|"):
        return art_run(run_id, spec, deps, out)
    return execute_run(run_id, spec, deps, out=out)


class BenchStudy(BackdoorStudy):
    def __init__(self, art: bool) -> None:
        super().__init__(bench_execute)
        self.art = art

    def plan(self, cfg: BackdoorStudyConfig, ctx: StudyContext) -> list[RunSpec]:
        runs = super().plan(cfg, ctx)
        if self.art:
            runs += [RunSpec(f"art|{r.run_id}", {"config": r.spec["config"], "of": r.run_id}, (r.run_id,))
                     for r in list(runs)]
        return runs

    def execute(self, cfg: BackdoorStudyConfig, ctx: StudyContext) -> Any:
        return partial(bench_execute, out=str(ctx.out))


def side_by_side(results: dict[str, dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Per data set × attack (and clean): modelward vs ART on the same models."""
    rows, data_rows = [], []
    mains = {rid: r for rid, r in results.items() if isinstance(r, dict) and "dataset" in r}
    arts = {r["art_of"]: r for r in results.values() if isinstance(r, dict) and "art_of" in r}
    groups: dict[tuple[str, str], list[str]] = {}
    for rid, r in mains.items():
        if rid in arts:
            groups.setdefault((r["dataset"], r["attack"]), []).append(rid)
    for (ds, a), ids in sorted(groups.items()):
        ours = [mains[i] for i in ids]
        theirs = [arts[i] for i in ids]
        key = "tpr" if a != "clean" else "fpr"
        row: dict[str, Any] = {"dataset": ds, "attack": a, "models": len(ids),
                               f"nc_{key}_ours": float(np.mean([r["neural_cleanse"]["flagged"] for r in ours])),
                               f"nc_{key}_art": float(np.mean([r["neural_cleanse"]["flagged"] for r in theirs])),
                               "strip_frr_ours": float(np.mean([r["strip"]["frr"] for r in ours])),
                               "strip_frr_art": float(np.mean([r["strip"]["frr"] for r in theirs]))}
        if a != "clean":
            row["strip_tpr_ours"] = float(np.mean([r["strip"]["tpr"] for r in ours]))
            row["strip_tpr_art"] = float(np.mean([r["strip"]["tpr"] for r in theirs]))
            for m in ("activation_clustering", "spectral_signature"):
                o = [r["data"][m] for r in ours]
                t = [r[m] for r in theirs]
                data_rows.append({"dataset": ds, "attack": a, "method": m, "models": len(ids),
                                  "auc_ours": float(np.mean([x["auc"] for x in o])),
                                  "auc_art": float(np.mean([x["auc"] for x in t])),
                                  "auc_in_target_ours": float(np.mean([x["auc_in_target"] for x in o])),
                                  "auc_in_target_art": float(np.mean([x["auc_in_target"] for x in t])),
                                  "tp_ours": int(np.sum([x["true_positives"] for x in o])),
                                  "fp_ours": int(np.sum([x["false_positives"] for x in o])),
                                  "tp_art": int(np.sum([x["true_positives"] for x in t])),
                                  "fp_art": int(np.sum([x["false_positives"] for x in t]))})
        rows.append(row)
    return {"art_model_input": rows, "art_data": data_rows}


def detect_only(cfg: BackdoorStudyConfig, models: Path, out: Path) -> list[dict[str, Any]]:
    """Model-level detection (Neural Cleanse, MM-BD) re-run on the saved models of an earlier run (``models`` is
    its ``--out``: ``config.json`` and ``models/``, read only); nothing is trained. One row per model, written to
    ``out/detect_only.{csv,json,md}``; for a detector change, without re-running the whole study."""
    saved = BackdoorStudyConfig.model_validate_json((models / "config.json").read_text())
    rows: list[dict[str, Any]] = []
    for ds in cfg.datasets:
        for attack in ["clean", *[a.name for a in ds.attacks]]:
            for seed in (saved.clean_seeds if attack == "clean" else saved.attack_seeds)[: len(cfg.attack_seeds)]:
                rid = f"{ds.name}|{attack}|{seed}"
                if not (run_folder(models, rid) / "model.safetensors").exists():
                    logging.warning("no saved model for %s", rid)
                    continue
                model, data, rc = load_run_model(saved, models, rid)
                verdicts, _ = detect_model(model, data, rc.detect, seed)
                row: dict[str, Any] = {"dataset": ds.name, "attack": attack, "seed": seed}
                for v in verdicts:
                    row[f"{v.detector}_statistic"] = v.statistic
                    row[f"{v.detector}_flagged"] = v.backdoored
                    row[f"{v.detector}_suspect"] = v.suspect_class
                rows.append(row)
                logging.info("%s: %s", rid, {k: v for k, v in row.items() if k.endswith(("statistic", "flagged"))})
    out.mkdir(parents=True, exist_ok=True)
    write_table(out, "detect_only", rows, title=f"model-level detection re-run on the saved models of {models}")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "runs/bench/backdoor"))
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--datasets", default="digits,rgb")
    ap.add_argument("--attacks", default="badnets,blend,wanet,clean_label")
    ap.add_argument("--no-art", action="store_true", help="modelward's detectors only")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--calibration-seeds", type=int, default=10,
                    help="clean reference models (seeds 100, 101, ...) the calibrated thresholds are taken from "
                         "(<out>/calibration; 0: none)")
    ap.add_argument("--detect-only", metavar="RUN", default=None,
                    help="re-run only the model-level detectors on the saved models of RUN (an earlier --out, read "
                         "only; nothing trained), writing <out>/detect_only.*")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    cfg = study_config(args.datasets.split(","), args.attacks.split(","), args.seeds, args.threads)
    out = Path(args.out)
    if args.detect_only:
        detect_only(cfg, Path(args.detect_only), out)
        return
    with RichProgress() as progress:
        tables = run_study(BenchStudy(not args.no_art), cfg, out, progress=progress)
    from modelward.core.ledger import RunLedger

    results = RunLedger(out / "ledger.sqlite").results()
    if args.calibration_seeds:
        ccfg = study_config(args.datasets.split(","), args.attacks.split(","), 0, args.threads,
                            clean_seeds=list(range(100, 100 + args.calibration_seeds)))
        with RichProgress() as progress:
            run_study(BenchStudy(False), ccfg, out / "calibration", progress=progress)
        cal = [r for r in RunLedger(out / "calibration" / "ledger.sqlite").results().values() if "dataset" in r]
        rows = calibrated_tables([r for r in results.values() if isinstance(r, dict) and "dataset" in r], cal)
        write_table(out, "calibrated", rows, title="detection at thresholds calibrated on other clean models")
        tables["calibrated"] = rows
    sbs = side_by_side(results)
    for name, rows in sbs.items():
        if rows:
            write_table(out, name, rows, title=f"modelward vs ART: {name}")
    for name, rows in {**tables, **sbs}.items():
        print(f"\n== {name}")
        for r in rows:
            print("  " + ", ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()))


if __name__ == "__main__":
    main()
