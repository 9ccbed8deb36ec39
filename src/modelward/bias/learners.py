"""Learners of seed 002 §9.2 (Fig. 9.3–9.4, Table 9.2, Table 9.6) and a deep model's penultimate-layer head.

- :class:`SGDSchedule` + :func:`fit_sgd` — linear classifiers trained by SGD with the log, hinge, modified-Huber,
  squared-hinge or perceptron loss (scikit-learn's ``SGDClassifier``). The learning-rate schedule is explicit: the
  digest found that scikit-learn's default ``"optimal"`` schedule gives slightly *negative* bias on Eq. 9.11 data
  where a constant rate gives the paper's positive bias, so the schedule is always part of the config.
- :func:`fit_lbfgs_logistic` — logistic regression by L-BFGS; :func:`fit_linear_svm` — SVM by SMO (libsvm, linear
  kernel, C = 1 as in Fig. 9.4); :func:`fit_gaussian_nb` — Gaussian naive Bayes (Table 9.2).
- :func:`linear_head` — slice a deep net at its penultimate layer (§9.3): features z = h(x) (the input of the last
  ``nn.Linear``) and the head g as a binary :class:`LinearModel` (w = W_{c1} − W_{c0}, b = b_{c1} − b_{c0}).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from pydantic import Field
from torch import nn

from modelward.bias.amplification import LinearModel
from modelward.core.config import StrictModel
from modelward.core.modules import eval_mode, model_device
from modelward.core.registry import Registry
from modelward.errors import ConfigError

SGDLoss = Literal["log_loss", "hinge", "modified_huber", "squared_hinge", "perceptron"]
#: name → learner ``fn(x, y, ...)`` (linear ones return :class:`FittedLinear`)
LEARNERS = Registry("learner")


class SGDSchedule(StrictModel):
    """SGD hyper-parameters, all explicit (scikit-learn ``SGDClassifier`` names).

    Args:
        loss: the SGD loss (default ``"log_loss"``: logistic regression).
        learning_rate / eta0 / power_t: the step-size schedule (``constant`` / ``optimal`` / ``invscaling`` /
            ``adaptive``), the initial step and the inverse-scaling exponent.
        alpha / penalty: regularisation strength and kind (``l2``, ``l1``, ``elasticnet`` or None).
        max_iter / tol: epochs and stopping tolerance; fit_intercept: learn b.

    Returns:
        A strict config for :func:`fit_sgd`.

    Example:
        >>> SGDSchedule(eta0=0.001).loss, SGDSchedule().learning_rate
        ('log_loss', 'constant')
    """

    loss: SGDLoss = "log_loss"
    learning_rate: Literal["constant", "optimal", "invscaling", "adaptive"] = "constant"
    eta0: float = Field(0.01, gt=0.0)
    power_t: float = 0.5
    alpha: float = Field(1e-4, ge=0.0)  # regularisation strength (ℓ2 unless penalty says otherwise)
    penalty: Literal["l2", "l1", "elasticnet"] | None = "l2"
    max_iter: int = Field(1000, ge=1)
    tol: float | None = 1e-3
    fit_intercept: bool = True


@dataclass(frozen=True)
class FittedLinear:
    """A trained linear classifier and how it was trained."""

    model: LinearModel
    learner: str
    n_iter: int | None = None


def _check_xy(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y).astype(np.int64)
    if x.ndim != 2 or len(x) != len(y):
        raise ConfigError(f"learner: need x of shape (N, d) and N labels, got {x.shape} and {y.shape}")
    if set(np.unique(y)) - {0, 1} or len(np.unique(y)) < 2:
        raise ConfigError("learner: labels must be binary 0/1 with both classes present")
    return x, y


@LEARNERS.register("sgd")
def fit_sgd(x: np.ndarray, y: np.ndarray, schedule: SGDSchedule | None = None, seed: int = 0) -> FittedLinear:
    """SGD-trained linear classifier (Fig. 9.3–9.4, Table 9.6 "logistic regression trained with SGD").

    Args:
        x: features (N, d); y: binary 0/1 labels with both classes (else ``ConfigError``).
        schedule: the :class:`SGDSchedule` (default: its defaults).
        seed: the SGD shuffling seed.

    Returns:
        :class:`FittedLinear` (``model``: the :class:`LinearModel`, ``learner``, ``n_iter``).

    Example:
        >>> from modelward.bias.amplification import asymmetric_gaussian
        >>> x, y = asymmetric_gaussian(n_weak=10).sample(200, np.random.default_rng(0), balanced=True)
        >>> fit_sgd(x, y, SGDSchedule(loss="log_loss", learning_rate="constant", eta0=0.01), seed=0).model.w.shape
        (12,)
    """
    import warnings

    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import SGDClassifier

    x, y = _check_xy(x, y)
    s = schedule or SGDSchedule()
    clf = SGDClassifier(loss=s.loss, learning_rate=s.learning_rate, eta0=s.eta0, power_t=s.power_t, alpha=s.alpha,
                        penalty=s.penalty, max_iter=s.max_iter, tol=s.tol, fit_intercept=s.fit_intercept,
                        random_state=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf.fit(x, y)
    return FittedLinear(LinearModel(clf.coef_[0].copy(), float(clf.intercept_[0])), f"sgd_{s.loss}",
                        int(clf.n_iter_))


@LEARNERS.register("lbfgs_logistic")
def fit_lbfgs_logistic(x: np.ndarray, y: np.ndarray, c: float = 1.0, max_iter: int = 1000) -> FittedLinear:
    """Logistic regression optimised by L-BFGS (Fig. 9.4: less bias amplification than SGD).

    Args:
        x: features (N, d); y: binary 0/1 labels.
        c: inverse regularisation strength C; max_iter: L-BFGS iterations.

    Returns:
        :class:`FittedLinear` with ``learner == "lbfgs_logistic"``.

    Example:
        >>> fit_lbfgs_logistic(np.array([[0.0], [1.0], [2.0], [3.0]]), np.array([0, 0, 1, 1])).model.predict(
        ...     np.array([[0.0], [3.0]]))
        array([0, 1])
    """
    from sklearn.linear_model import LogisticRegression

    x, y = _check_xy(x, y)
    clf = LogisticRegression(C=c, solver="lbfgs", max_iter=max_iter).fit(x, y)
    return FittedLinear(LinearModel(clf.coef_[0].copy(), float(clf.intercept_[0])), "lbfgs_logistic",
                        int(np.max(clf.n_iter_)))


@LEARNERS.register("linear_svm")
def fit_linear_svm(x: np.ndarray, y: np.ndarray, c: float = 1.0) -> FittedLinear:
    """SVM trained by SMO (libsvm), linear kernel, penalty C (Fig. 9.4 uses C = 1.0).

    Args:
        x: features (N, d); y: binary 0/1 labels; c: the penalty C.

    Returns:
        :class:`FittedLinear` with ``learner == "linear_svm"``.

    Example:
        >>> fit_linear_svm(np.array([[0.0], [1.0], [2.0], [3.0]]), np.array([0, 0, 1, 1])).learner
        'linear_svm'
    """
    from sklearn.svm import SVC

    x, y = _check_xy(x, y)
    clf = SVC(kernel="linear", C=c).fit(x, y)
    return FittedLinear(LinearModel(clf.coef_[0].copy(), float(clf.intercept_[0])), "linear_svm")


@LEARNERS.register("gaussian_nb")
def fit_gaussian_nb(x: np.ndarray, y: np.ndarray):  # type: ignore[no-untyped-def]
    """Gaussian naive Bayes (Table 9.2); returns the fitted scikit-learn estimator (``.predict``).

    Args:
        x: features (N, d); y: binary 0/1 labels.

    Returns:
        The fitted ``sklearn.naive_bayes.GaussianNB``.

    Example:
        >>> fit_gaussian_nb(np.array([[0.0], [1.0], [2.0], [3.0]]), np.array([0, 0, 1, 1])).predict([[0.0], [3.0]])
        array([0, 1])
    """
    from sklearn.naive_bayes import GaussianNB

    x, y = _check_xy(x, y)
    return GaussianNB().fit(x, y)


def fit_learner(name: str, x: np.ndarray, y: np.ndarray, schedule: SGDSchedule | None = None, seed: int = 0,
                c: float = 1.0):  # type: ignore[no-untyped-def]
    """Dispatch by name: ``sgd`` (with ``schedule``), ``lbfgs_logistic``, ``linear_svm``, ``gaussian_nb``.
    Linear learners return :class:`FittedLinear`; ``gaussian_nb`` a scikit-learn estimator.

    Args:
        name: a key of ``LEARNERS`` (unknown names raise ``ConfigError`` naming the valid ones).
        x: features (N, d); y: binary 0/1 labels.
        schedule / seed: used by ``sgd``; c: the C of ``lbfgs_logistic`` and ``linear_svm``.

    Returns:
        :class:`FittedLinear`, or the ``GaussianNB`` estimator for ``gaussian_nb``.

    Example:
        >>> fit_learner("lbfgs_logistic", np.array([[0.0], [1.0], [2.0], [3.0]]), np.array([0, 0, 1, 1])).learner
        'lbfgs_logistic'
    """
    fn = LEARNERS.get(name)  # ConfigError naming the valid choices
    if name == "sgd":
        return fn(x, y, schedule, seed)
    if name in ("lbfgs_logistic", "linear_svm"):
        return fn(x, y, c)
    return fn(x, y)


def _last_linear(model: nn.Module, head: str | None) -> tuple[str, nn.Linear]:
    mods = dict(model.named_modules())
    if head is not None:
        m = mods.get(head)
        if not isinstance(m, nn.Linear):
            lin = [n for n, mm in mods.items() if isinstance(mm, nn.Linear)]
            raise ConfigError(f"head {head!r}: not an nn.Linear of the model; its linear layers are {lin}")
        return head, m
    linear = [(n, m) for n, m in mods.items() if isinstance(m, nn.Linear)]
    if not linear:
        raise ConfigError("linear_head: the model has no nn.Linear layer to use as the head")
    return linear[-1]


@torch.no_grad()
def penultimate_features(model: nn.Module, x: torch.Tensor, head: str | None = None,
                         batch_size: int = 1024) -> np.ndarray:
    """z = h(x): the input of the head layer (the last ``nn.Linear`` unless ``head`` names one), as float64.

    Args:
        model: the deep net; x: its inputs.
        head: the name of the head ``nn.Linear`` (default: the last one).
        batch_size: inputs per forward pass (the model runs in eval mode; its modes are restored).

    Returns:
        A float64 array (N, head.in_features).

    Example:
        >>> net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
        >>> penultimate_features(net, torch.randn(5, 4)).shape
        (5, 8)
    """
    name, lin = _last_linear(model, head)
    feats: list[torch.Tensor] = []

    def grab(_m: nn.Module, inp: tuple[torch.Tensor, ...]) -> None:
        feats.append(inp[0].detach().flatten(1).double().cpu())

    h = lin.register_forward_pre_hook(grab)
    dev = model_device(model)
    try:
        with eval_mode(model):
            for i in range(0, len(x), batch_size):
                model(x[i : i + batch_size].to(dev))
    finally:
        h.remove()
    return torch.cat(feats).numpy()


def linear_head(model: nn.Module, classes: tuple[int, int] = (0, 1), head: str | None = None) -> LinearModel:
    """The head g of a deep net sliced at its penultimate layer, as a binary linear model predicting
    ``classes[1]`` iff (W_{c1} − W_{c0})ᵀz + (b_{c1} − b_{c0}) > 0 (exactly the argmax for a 2-way head).

    Args:
        model: the deep net; classes: two different outputs (c0, c1) of its head.
        head: the name of the head ``nn.Linear`` (default: the last one).

    Returns:
        A :class:`~modelward.bias.amplification.LinearModel` over the penultimate features.

    Example:
        >>> net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
        >>> linear_head(net, classes=(0, 2)).w.shape
        (8,)
    """
    _, lin = _last_linear(model, head)
    c0, c1 = classes
    n_out = lin.out_features
    if not (0 <= c0 < n_out and 0 <= c1 < n_out) or c0 == c1:
        raise ConfigError(f"linear_head: classes {classes} must be two different outputs of the {n_out}-way head")
    w = (lin.weight[c1] - lin.weight[c0]).detach().double().cpu().numpy()
    b = 0.0 if lin.bias is None else float((lin.bias[c1] - lin.bias[c0]).item())
    return LinearModel(w, b)
