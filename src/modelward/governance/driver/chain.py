"""What the driver checks of the parties it reaches: that they chain into the model, and where to resume.

Example:
    >>> check_chain(driver.status, ["alice", "bob"])  # doctest: +SKIP
    >>> resume_target({"alice": {"prepared": None, "step": 4, "checkpoints": [0, 4]},
    ...                "bob": {"prepared": None, "step": 4, "checkpoints": [0, 4]}})
    (set(), None)
"""

from __future__ import annotations

from typing import Any

from modelward.governance.protocol import PartyError


def check_chain(status: dict[str, dict[str, Any]], names: list[str]) -> None:
    """Raise PartyError unless the parties' statuses (by name, `names` in chain order) form the expected chain:
    their layers join into the model's, the first holds the inputs and the last the labels, each names the other
    as neighbour, shapes meet at every cut, and inputs and labels are aligned."""
    st = [status[n] for n in names]
    all_layers = st[0]["all_layers"]
    joined = [lay for s in st for lay in s["layers"]]
    if joined != all_layers:
        raise PartyError(f"the parties' layers {[s['layers'] for s in st]} (in config order "
                         f"{names}) do not chain into the model's layers {all_layers}")
    if not st[0]["first"] or not st[-1]["last"]:
        raise PartyError("the first party must hold the inputs and the last one the labels")
    for a, b in zip(st[:-1], st[1:], strict=True):
        if a["next"] != b["party"] or b["prev"] != a["party"]:
            raise PartyError(f"{a['party']} says its next party is {a['next']!r} and {b['party']} says its "
                             f"previous one is {b['prev']!r}; the config's chain is {names}")
        if a["out_shape"] != b["in_shape"]:
            raise PartyError(f"{a['party']} outputs {a['out_shape']} but {b['party']} expects {b['in_shape']}")
    if st[0]["n_train"] != st[-1]["n_train"] or st[0]["n_test"] != st[-1]["n_test"]:
        raise PartyError(f"inputs ({st[0]['n_train']}/{st[0]['n_test']} train/test samples) and labels "
                         f"({st[-1]['n_train']}/{st[-1]['n_test']}) are not aligned")


def resume_target(status: dict[str, dict[str, Any]]) -> tuple[set[int], int | None]:
    """Where to continue after a party came back: (the prepared steps to abort first, the checkpoint step every
    party restores to — None when all parties are at the same step and can continue from there)."""
    prepared = {s["prepared"] for s in status.values() if s["prepared"] is not None}
    steps = {int(s["step"]) for s in status.values()}
    if len(steps) == 1:
        return prepared, None
    common = set.intersection(*(set(s["checkpoints"]) for s in status.values()))
    return prepared, max(common)
