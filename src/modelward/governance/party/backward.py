"""A party's backward pass in two parts: the input gradient first, the weight gradients later.

A party that is not the first one owes its previous party the gradient of the loss with respect to the activation
it received; its own weight gradients are only needed for its own update. Splitting the backward pass lets it send
the input gradient as soon as it exists and compute the weight gradients while the parties before it run their own
backward passes (the "B" and "W" passes of zero-bubble pipeline schedules, Qi et al. 2024, "Zero Bubble Pipeline
Parallelism"). Nothing is computed twice: the input pass records, at every node of the autograd graph where a
parameter's gradient branches off the path to the input, the gradient arriving there; the weight pass starts from
those recorded gradients and runs only the weight branch of each such node. The gradients are bit-identical to one
``backward()`` call (same kernels, same inputs).

Only public autograd APIs are used (``Node.register_prehook``, ``GradientEdge``, ``torch.autograd.grad``).
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch.autograd.graph import GradientEdge, Node


def _node_of(t: torch.Tensor) -> Node:
    """The autograd node a tensor's gradient flows into: its grad_fn, or the accumulator of a leaf."""
    if t.grad_fn is not None:
        return t.grad_fn
    node = t.view_as(t).grad_fn  # a leaf's gradient accumulator is reachable through a view of it
    if node is None:
        raise ValueError("tensor does not require grad")
    return node.next_functions[0][0]


@dataclass(eq=False)
class _Group:
    """Parameters whose gradients branch off the input path at the same nodes (merged when they share one)."""

    params: list[torch.Tensor] = field(default_factory=list)
    nodes: list[Node] = field(default_factory=list)
    grads: dict[int, tuple] = field(default_factory=dict)  # node index -> the gradients recorded there


class WeightPass:
    """What the input pass recorded; :meth:`run` accumulates the weight gradients into ``param.grad``."""

    def __init__(self, groups: list[_Group]) -> None:
        self.groups = groups

    def run(self) -> None:
        """Compute the weight gradients (call once, after :func:`input_gradient`).

        Example:
            >>> (g,), weights = input_gradient(loss, [x], params)  # doctest: +SKIP
            >>> weights.run(); opt.step()  # doctest: +SKIP
        """
        for grp in self.groups:
            edges, outs = [], []
            for i, node in enumerate(grp.nodes):
                for k, g in enumerate(grp.grads.get(i, ())):
                    if g is not None:
                        edges.append(GradientEdge(node, k))
                        outs.append(g)
            if not edges:
                continue
            handles = []
            if len(grp.nodes) > 1:
                # a node downstream of another recorded node must see its recorded gradient, not one computed
                # again from the other (that would count the path between them twice)
                for i, node in enumerate(grp.nodes):
                    rec = grp.grads.get(i)
                    if rec is not None:
                        handles.append(node.register_prehook(lambda _g, rec=rec: rec))
            try:
                dws = torch.autograd.grad(edges, [GradientEdge(_node_of(p), 0) for p in grp.params], outs,
                                          retain_graph=True, allow_unused=True)
            finally:
                for h in handles:
                    h.remove()
            for p, dw in zip(grp.params, dws, strict=True):
                if dw is not None:
                    p.grad = dw if p.grad is None else p.grad + dw
        self.groups = []


def input_gradient(root: torch.Tensor, inputs: Sequence[torch.Tensor], params: Sequence[torch.Tensor],
                   root_grad: torch.Tensor | None = None) -> tuple[tuple[torch.Tensor, ...], WeightPass]:
    """The gradient of `root` with respect to `inputs` only, and the weight pass that completes the backward.

    Args:
        root: the loss (scalar) or an output whose gradient is `root_grad`.
        inputs: leaf tensors requiring grad (the activation this party received).
        params: the parameters whose gradients :meth:`WeightPass.run` computes later.
        root_grad: the gradient of `root` (None for a scalar loss).

    Returns:
        (the input gradients, a :class:`WeightPass`). Until the weight pass ran, the graph stays alive.

    Example:
        >>> x = torch.randn(4, 3, requires_grad=True); lin = torch.nn.Linear(3, 2)
        >>> (gx,), weights = input_gradient(lin(x).sum(), [x], list(lin.parameters()))
        >>> weights.run(); lin.weight.grad.shape
        torch.Size([2, 3])
    """
    root_node = _node_of(root)
    # the graph's edges reversed (who sends its gradient to whom), from the root down
    parents: dict[Node, list[Node]] = defaultdict(list)
    seen, todo = {root_node}, deque([root_node])
    while todo:
        node = todo.popleft()
        for nxt, _ in node.next_functions:
            if nxt is not None:
                parents[nxt].append(node)
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
    # the nodes on a path from the root to an input: what the input pass runs
    on_path: set[Node] = set()
    todo = deque(n for n in (_node_of(x) for x in inputs) if n in seen)
    while todo:
        node = todo.popleft()
        for par in parents[node]:
            if par not in on_path:
                on_path.add(par)
                todo.append(par)
    by_node: dict[Node, _Group] = {}
    groups: list[_Group] = []
    for p in params:
        acc = _node_of(p)
        if acc not in seen:
            continue  # not used by this pass: no gradient, as with backward()
        # walk up from the parameter to the first nodes on the input path: its gradient branches off there
        branch, visited, todo = set(), {acc}, deque([acc])
        while todo:
            node = todo.popleft()
            for par in parents[node]:
                if par in on_path:
                    branch.add(par)
                elif par not in visited:
                    visited.add(par)
                    todo.append(par)
        grp = next((by_node[n] for n in branch if n in by_node), None)
        if grp is None:
            grp = _Group()
            groups.append(grp)
        grp.params.append(p)
        for n in branch:
            other = by_node.get(n)
            if other is not None and other is not grp:  # two groups meet: merge them
                grp.params.extend(q for q in other.params if all(q is not r for r in grp.params))
                for m in other.nodes:
                    if m not in grp.nodes:
                        grp.nodes.append(m)
                    by_node[m] = grp
                groups.remove(other)
            if n not in grp.nodes:
                grp.nodes.append(n)
            by_node[n] = grp
    handles = []

    def recorder(grp: _Group, i: int):
        def hook(grad_outputs: tuple) -> None:
            grp.grads[i] = grad_outputs
        return hook

    try:
        for grp in groups:
            for i, node in enumerate(grp.nodes):
                handles.append(node.register_prehook(recorder(grp, i)))
        grads = torch.autograd.grad(root, list(inputs), root_grad, retain_graph=True)
    finally:
        for h in handles:
            h.remove()
    return grads, WeightPass(groups)
