"""Read backdoor_probe.py's statistics against clean references (leave-one-out, same class), per group."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from backdoor_stimulation import Linear  # noqa: E402

SIGN = {"dist": -1, "uap": 1, "adv": 1, "anp": 1}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--stats", default="runs/bench/backdoor_probe/stats.json")
    ap.add_argument("--alpha", type=float, default=0.05)
    ap.add_argument("--refs", default="saved", help="saved: the saved clean models of other seeds")
    a = ap.parse_args()
    st = json.loads(Path(a.stats).read_text())
    for ds in ("digits", "rgb"):
        clean = {k: v for k, v in st.items() if k.startswith(f"saved|{ds}|clean|")}
        if len(clean) < 4:
            continue
        groups: dict[str, list[str]] = {}
        for k in st:
            src, d, g, s = k.split("|")
            if d == ds:
                groups.setdefault(f"{src}-{g}", []).append(k)
        print(f"== {ds}  (refs: {len(clean)} saved clean, leave-one-out)")
        for stat in SIGN:
            line = [f"{stat:5s}"]
            for g, keys in sorted(groups.items()):
                flagged = target = 0
                for k in keys:
                    refs = [SIGN[stat] * np.asarray(v[stat]) for kk, v in clean.items() if kk != k]
                    refs = [r for r in refs if np.all(np.isfinite(r))]
                    cal = Linear("mmbd", refs, a.alpha)
                    x = SIGN[stat] * np.asarray(st[k][stat])
                    if not np.all(np.isfinite(x)):
                        x = np.nan_to_num(x, posinf=1e3, neginf=-1e3)
                    p, c = cal.p_value(x)
                    flagged += p < a.alpha
                    target += p < a.alpha and c == st[k]["target"]
                line.append(f"{g}:{flagged}/{len(keys)}({target})")
            print("  ".join(line))


if __name__ == "__main__":
    main()
