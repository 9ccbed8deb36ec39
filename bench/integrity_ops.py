"""What the poisoning defence adds to one step of the label holder, measured op by op (issue 36: speed within 5 %).

Bob's part of ``bench/split_overhead.py``'s default model (CNN [64,128] fc 256, cut after conv1, batch 128, one
thread), with the shipped ``[integrity]``: the median wall time of each thing :class:`StepIntegrity` does in a step
(the clipped loss and the trend detector, the step cap, the bound on the running statistics) beside Bob's forward
pass and the plain cross-entropy it replaces. Independent of the party processes, so far less noisy than the
end-to-end ratio of ``bench/split_overhead.py --integrity both``.

    OMP_NUM_THREADS=1 python bench/integrity_ops.py [--repeat 300]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from modelward.core.init import init_model_
from modelward.core.zoo import ModelConfig, build_model
from modelward.governance.integrity import IntegrityConfig, StepIntegrity
from modelward.governance.plan import make_plan, segment_of


def median_ms(fn: Callable[[], object], n: int) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=300)
    args = ap.parse_args()
    torch.set_num_threads(1)
    model = init_model_(build_model(ModelConfig(arch="cnn", channels=[64, 128], fc=256), (1, 8, 8), 10), seed=0)
    plan = make_plan(model, ["alice", "bob"], ["conv1"])
    alice, bob = segment_of(model, plan.owners["alice"]), segment_of(model, plan.owners["bob"])
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        h = alice(torch.randn(128, 1, 8, 8, generator=gen))
    y = torch.randint(0, 10, (128,), generator=gen)
    si = StepIntegrity(IntegrityConfig(), bob, name="bob", label_holder=True, receives=True, num_classes=10,
                       state_dir=None)
    params = list(bob.parameters())
    buffers = {k: v for k, v in bob.state_dict().items() if "running" in k}
    for s in range(40):  # past the warm-up: every bound armed, the detector watching
        bob.zero_grad()
        root, _ = si.training_loss(s, bob(h), y)
        root.backward()
        si.before_optimizer_step(s, params)
        si.after_update({k: v.clone() for k, v in buffers.items()}, buffers)
    out = bob(h)
    before = {k: v.clone() for k, v in buffers.items()}
    n = args.repeat
    rows = {
        "bob's forward pass (for scale)": median_ms(lambda: bob(h), n),
        "plain cross-entropy (what the clipped loss replaces)": median_ms(lambda: F.cross_entropy(out, y), n),
        "clipped loss + trend detector (training_loss)": median_ms(lambda: si.training_loss(10_000, out, y), n),
        "step cap (before_optimizer_step)": median_ms(lambda: si.before_optimizer_step(10_000, params), n),
        "bounded running statistics (after_update)": median_ms(lambda: si.after_update(before, buffers), n),
    }
    for k, v in rows.items():
        print(f"{k:55s} {v:7.3f} ms")
    extra = sum(list(rows.values())[2:]) - rows["plain cross-entropy (what the clipped loss replaces)"]
    print(f"added per step of the label holder: {extra:.3f} ms")


if __name__ == "__main__":
    main()
