"""A party's inference operations: evaluation, prediction, and the fetch of a prediction's result.

Both passes take the chain like a training step, so every party, the label holder included, consents to each.
What leaves goes through the party's release path (:mod:`.release`): the label holder's evaluation answer is a
noisy sum over the rows of one evaluation (with the training loss of the steps committed since the last answer),
and a prediction's outputs stay with the label holder — in its own folder when it keeps them (the default), or
until the receiver its policy names fetches them in the owner's form.

Example:
    >>> ops = Inference(cfg, holding, window, two_phase, release, forward=party._next_call)  # doctest: +SKIP
    >>> reply = ops.eval(msg, "alice")  # doctest: +SKIP
"""

from __future__ import annotations

import secrets
from collections import OrderedDict
from collections.abc import Callable

import torch
import torch.nn.functional as F

from modelward.governance.flow_policy import keep_outputs, receiver_of
from modelward.governance.party.commits import TwoPhase
from modelward.governance.party.config import PartyConfig
from modelward.governance.party.input_protection import InputProtection, protected
from modelward.governance.party.pipeline import StalenessWindow
from modelward.governance.party.release import ReleasePath
from modelward.governance.party.segment import Holding
from modelward.governance.protocol import PartyError, anchors_of
from modelward.governance.wire import Message, WireError, expect

MAX_RESULTS = 16  # prediction results kept for the driver to fetch (oldest dropped)
Forward = Callable[[Message, dict, dict], Message]


def _part(meta: dict) -> tuple[int, int]:
    """``meta.part = [i, k]``: part i of an evaluation in k parts (default [0, 1])."""
    part = meta.get("part", [0, 1])
    if not (isinstance(part, list) and len(part) == 2 and all(isinstance(v, int) and not isinstance(v, bool)
                                                              for v in part) and 0 <= part[0] < part[1] <= 1 << 20):
        raise WireError(f"meta.part {part!r}: expected [i, k] with 0 <= i < k")
    return part[0], part[1]


class Inference:
    """The evaluation, prediction and fetch operations of one party.

    Args:
        cfg: the party's configuration (its name, driver, policy, checkpoint folder).
        holding: its segment and data column; window: its staleness window (no inference while steps are in
            flight); two_phase: its commits (an evaluation carries the commit of the last step).
        release: its release path; forward: ``forward(msg, meta, tensors)``: the operation continued to the next
            party (the party's ``_next_call``).
    """

    def __init__(self, cfg: PartyConfig, holding: Holding, window: StalenessWindow, two_phase: TwoPhase,
                 release: ReleasePath, forward: Forward, inputs: InputProtection | None = None) -> None:
        self.cfg, self.holding, self.window, self.two, self.out = cfg, holding, window, two_phase, release
        self.forward, self.inputs = forward, inputs  # (inputs: the first party's input protection, or None)
        self.results: OrderedDict[str, torch.Tensor] = OrderedDict()

    def eval(self, msg: Message, caller: str) -> Message:
        """A metric on the label holder's labels; only a number travels back, through the release path.

        It may carry the commit of the last training step (``meta.commit``, handled as by a step: the evaluation
        then scores the state every party has voted for). ``meta.part = [i, k]``: part i of an evaluation in k
        parts; the label holder answers the sum over all of them with the last."""
        h, out_ = self.holding, self.out
        split = h.split_of(msg)
        idx, x = h.input(msg, split, h.limit())
        self.window.refuse_in_flight(msg.op)
        part = _part(msg.meta)
        carried, held = self.two.carried(msg)
        out = h.forward_eval(x)
        metric = msg.meta.get("metric", "error")
        if not h.is_last:
            meta = {"split": split, "metric": metric, "part": list(part)}
            r = self.forward(msg, meta if carried is None else {**meta, "commit": carried}, {"h": protected(self.inputs, out, x), "idx": idx})
            self.two.held(held, "eval")
            return out_.reply("eval", meta={k: out_.release(caller, "relay", r.meta[k]) for k in
                                            ("sum", "n", "train_loss", "withheld") if k in r.meta},
                              anchors=anchors_of(r, self.cfg.name))
        y = h.labels(split)[idx]
        if metric == "error":
            per_row = (out.argmax(1) != y).double()
            exact = float(per_row.sum().item())
        elif metric == "cross_entropy":
            per_row = F.cross_entropy(out, y, reduction="none")
            exact = float(F.cross_entropy(out, y, reduction="sum").item())  # bit for bit the monolithic sum
        else:
            raise WireError(f"meta.metric {metric!r}: valid choices: error, cross_entropy")
        total = out_.release(caller, "eval_sum", per_row, idx=idx, metric=metric, exact=exact, session=msg.session,
                             part=part)
        last = part[0] + 1 == part[1]
        meta = {"sum": total, "n": out_.release(caller, "status", len(y))}
        if last:
            meta["train_loss"] = out_.release(caller, "train_loss", None)
        return out_.reply("eval", meta=meta)

    def predict(self, msg: Message, caller: str) -> Message:
        """Prediction through the chain. The first party takes indices of its samples (or, from the driver of its
        own organisation, inputs x); the label holder keeps the logits (its folder, or for the receiver to fetch)."""
        h, out_ = self.holding, self.out
        limit = h.limit()
        self.window.refuse_in_flight(msg.op)
        if h.is_first and "x" in msg.tensors:
            x = h.bounded(expect(msg, "x", torch.float32, (None, *h.in_shape), limit), "input x")
            idx = torch.arange(len(x))
        else:
            idx, x = h.input(msg, h.split_of(msg), limit)
        out = h.forward_eval(x)
        if not h.is_last:
            r = self.forward(msg, {"split": msg.meta.get("split", "test")},
                             {"h": protected(self.inputs, out, x), "idx": idx})
            meta = {k: out_.release(caller, "relay", r.meta[k]) for k in ("token", "n")}
            if r.meta.get("kept"):
                meta["kept"] = out_.release(caller, "relay", str(r.meta["kept"])[:512])
            return out_.reply("predict", meta=meta, anchors=anchors_of(r, self.cfg.name))
        token = secrets.token_hex(16)
        cfg = self.cfg
        if receiver_of(cfg.policy.predict, cfg.name) == cfg.name and cfg.driver != cfg.name:
            # the owner keeps its outputs (policy.predict.result_receiver = "owner"): nothing leaves, not even to
            # the driver; they go to this party's own folder (its name only in the answer)
            path = keep_outputs(cfg.checkpoint_dir, msg.session, token, out, idx)
            return out_.reply("predict", meta={
                "token": out_.release(caller, "status", ""), "n": out_.release(caller, "status", len(out)),
                "kept": out_.release(caller, "status", f"{cfg.name}: <checkpoint_dir>/predictions/{path.name}")})
        self.results[token] = out
        while len(self.results) > MAX_RESULTS:
            self.results.popitem(last=False)
        return out_.reply("predict", meta={"token": out_.release(caller, "status", token),
                                           "n": out_.release(caller, "status", len(out))})

    def fetch(self, msg: Message, caller: str) -> Message:
        """The receiver the policy names collects a prediction (once), in the owner's form (the flow policy has
        checked who asks)."""
        out = self.results.pop(str(msg.meta.get("token", "")), None)
        if out is None:
            raise PartyError(f"party {self.cfg.name}: no prediction result with that token (fetched already, or "
                             f"dropped: at most {MAX_RESULTS} are kept)")
        released = self.out.release(caller, "prediction", out)
        if released.value is None:
            raise PartyError(f"party {self.cfg.name}: {released.note}")
        return self.out.reply("fetch", meta={"form": self.out.release(caller, "status", self.cfg.policy.predict.form)},
                              tensors={"out": released})
