"""Weight-delta matching (Wang & Li 2024, section IV, eq. 12-14): replay the client's round.

A FedAvg client sends ``w* - w`` after E epochs of local training. The pseudo-gradient baseline
treats that as one big gradient step, exact only for a single SGD step. Weight-delta matching
instead runs the same local training on the dummy batch, differentiably, and compares the
simulated delta ``w' - w`` with the received one (eq. 12); the dummy embeddings then follow the
gradient of that distance (eq. 13). Labels are known here (the engine's precondition), so
eq. 14's label update is not needed.

Every step is ``torch.func.grad`` of the task loss with the parameters threaded through
``functional_call``, so one implementation serves both uses: under outer autograd the delta is
differentiable in the embeddings (second order, like ``create_graph=True``), and under ``vmap``
it scores LAMP's candidates in batches.

What the simulation assumes, and when it is exact (a test checks the exact cases):

* The protocol facts come from the update's metadata: E, the local batch b (n_k when unset),
  the client lr and the optimizer (plain SGD, or Adam with torch's defaults), as the server
  declared them.
* Local batch order. The client reshuffles every epoch with a permutation drawn from its own
  seed, which the server does not know. The simulation takes the dummy rows in the order given,
  every epoch, cut into consecutive local batches of b. With b >= n_k (one local batch per
  epoch: order is irrelevant to a mean loss) or with shuffling off, that is the client's own
  order and the simulation is exact; otherwise the split is a guess (``order_reproducible`` is
  False and the attack says so in its result).
* Dropout. In train mode the simulation draws its own masks; the client's are unknowable.
* A trained token-embedding table. Dummy *embeddings* bypass the table, but the client's later
  steps read the rows its earlier steps moved. Given the token ids the positions stand for
  (the attacker passes its current nearest-token guess; a test passes the truth), each step's
  input is ``x + (W_t - W_0)[ids]``: exactly ``W_t[ids]`` at the truth, and the table's
  gradient gets the input side by autograd's scatter-add, as ``nn.Embedding`` would (the padding
  row excepted, as ``padding_idx`` does). Without ids the drift is left out.

Rounding. The client's delta is ``w* - w`` in float32, and at FedAvg's small learning rates
``lr * g`` is often near a weight's last bit, so ``-delta / lr`` is visibly off the gradient it
came from. The replay repeats the client's arithmetic (torch.optim's single-rounding SGD update,
then the subtraction), so at the truth it reproduces the delta bit for bit and the matching
loss is 0, where the pseudo-gradient stays at the rounding's floor. So even a one-step round is
replayed, not matched as its gradient (which is the same function only in exact arithmetic).

Cost. Where the table only feeds the input (not tied to an output head), only its rows that
the batch reads ever get a gradient, so the replay carries just those rows (any superset gives
the same numbers: a row without gradient stays put under SGD and Adam alike). A token table is
a large share of a small encoder's weights, and its dense update would be replayed every step.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call, grad

from gradleak.errors import GradleakError
from gradleak.federated.payload import UpdatePayload

# torch.optim.Adam's defaults, which the client uses.
ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8

_REQUIRED = ("epochs", "local_batch_size", "lr", "optimizer", "n_samples")

Params = dict[str, torch.Tensor]


@dataclass(frozen=True)
class LocalTraining:
    """The protocol facts a FedAvg round depends on, as the update's metadata declares them."""

    epochs: int
    batch_size: int
    lr: float
    optimizer: str
    shuffle: bool
    n_samples: int

    @classmethod
    def from_update(cls, update: UpdatePayload) -> LocalTraining:
        """Read the facts; a FedSGD update or one that lacks them cannot be simulated."""
        if update.kind != "weight_delta":
            raise GradleakError(
                "--fedavg-match simulate replays FedAvg local training, but this update is a "
                "FedSGD gradient: use --fedavg-match pseudo"
            )
        meta = update.metadata
        missing = [k for k in _REQUIRED if k not in meta]
        if missing:
            raise GradleakError(
                f"--fedavg-match simulate needs the round's protocol facts, but the update does "
                f"not declare {', '.join(missing)}: use --fedavg-match pseudo"
            )
        if meta["optimizer"] not in ("sgd", "adam"):
            raise GradleakError(
                f"--fedavg-match simulate replays sgd or adam, not the client's "
                f"'{meta['optimizer']}': use --fedavg-match pseudo"
            )
        n = int(meta["n_samples"])
        return cls(
            epochs=int(meta["epochs"]),
            batch_size=min(int(meta["local_batch_size"] or n), n),
            lr=float(meta["lr"]),
            optimizer=str(meta["optimizer"]),
            shuffle=bool(meta.get("shuffle", True)),
            n_samples=n,
        )

    @property
    def batches(self) -> list[list[int]]:
        """One epoch's local batches of dummy rows, in the order given."""
        n, b = self.n_samples, self.batch_size
        return [list(range(start, min(start + b, n))) for start in range(0, n, b)]

    @property
    def steps(self) -> int:
        return self.epochs * len(self.batches)

    @property
    def order_reproducible(self) -> bool:
        """Whether the client's local batches are the simulation's (see the module notes)."""
        return not self.shuffle or self.batch_size >= self.n_samples


def _sgd(params: Params, grads: Params, state: dict, lr: float) -> Params:
    """One step of torch.optim.SGD (no momentum): ``p.add_(g, alpha=-lr)``, one rounding per
    entry as the client's, in one pass (``p - lr * g`` takes two)."""
    return {n: torch.add(p, grads[n], alpha=-lr) for n, p in params.items()}


def _safe_sqrt(x: torch.Tensor) -> torch.Tensor:
    """sqrt whose derivative at 0 is 0 instead of inf.

    An entry whose gradient was 0 so far has second moment 0; the plain sqrt's infinite
    derivative times a zero first moment is NaN in the backward pass. The true derivative of
    Adam's step through the second moment is 0 there (the first moment is 0 too).
    """
    positive = x > 0
    return torch.where(positive, torch.sqrt(torch.where(positive, x, torch.ones_like(x))), 0.0)


def _adam(params: Params, grads: Params, state: dict, lr: float) -> Params:
    """One step of torch.optim.Adam (defaults: no weight decay, no amsgrad), functionally."""
    beta1, beta2 = ADAM_BETAS
    state["step"] = step = state.get("step", 0) + 1
    first = state.setdefault("m", {n: torch.zeros_like(p) for n, p in params.items()})
    second = state.setdefault("v", {n: torch.zeros_like(p) for n, p in params.items()})
    correction1 = 1 - beta1**step
    correction2_sqrt = math.sqrt(1 - beta2**step)
    out = {}
    for n, p in params.items():
        g = grads[n]
        first[n] = first[n] + (1 - beta1) * (g - first[n])  # torch: exp_avg.lerp_(g, 1 - beta1)
        second[n] = beta2 * second[n] + (1 - beta2) * g * g
        denom = _safe_sqrt(second[n]) / correction2_sqrt + ADAM_EPS
        out[n] = p - (lr / correction1) * first[n] / denom
    return out


_STEPS: dict[str, Callable[[Params, Params, dict, float], Params]] = {"sgd": _sgd, "adam": _adam}


@dataclass(frozen=True)
class TableRows:
    """Which token-embedding rows a replay carries, and where each token's row sits."""

    index: torch.Tensor  # [U] table rows, sorted
    slot: torch.Tensor  # [V] position of a token's row in ``index`` (0 where not carried)
    start: torch.Tensor  # [U, d] the carried rows' global weights

    @classmethod
    def of(cls, ids: torch.Tensor, table: torch.Tensor) -> TableRows:
        index = ids.flatten().unique()
        slot = torch.zeros(table.shape[0], dtype=torch.long, device=table.device)
        slot[index] = torch.arange(len(index), device=table.device)
        return cls(index=index, slot=slot, start=table[index])

    def local(self, ids: torch.Tensor) -> torch.Tensor:
        return self.slot[ids]


@dataclass(frozen=True)
class EmbeddingTable:
    """The trained token-embedding table: its parameter name, padding row (if any), and
    whether the input lookup is its only use (not tied to an output head), so a replay may
    carry only the rows the batch reads."""

    name: str
    padding_idx: int | None
    input_only: bool = False


class LocalTrainingSimulator:
    """Replays a FedAvg round on a dummy batch and returns the weight delta by parameter name.

    ``loss_module`` is called as ``loss_module(embeds, labels, ids, attention_mask=...,
    token_type_ids=...)`` and its parameter names are ``prefix + name``. ``initial`` holds the
    global weights of every parameter the client trains: all of them move in every step, not
    only those it sends (partial sharing still trains the whole model).
    """

    def __init__(
        self,
        loss_module: nn.Module,
        prefix: str,
        initial: Params,
        facts: LocalTraining,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None,
        table: EmbeddingTable | None = None,
    ) -> None:
        if attention_mask is None:
            raise GradleakError("--fedavg-match simulate needs known sequence lengths")
        if attention_mask.shape[0] != facts.n_samples:
            raise GradleakError(
                f"the update declares n_k = {facts.n_samples} samples but the server knows "
                f"{attention_mask.shape[0]} sequences: the round cannot be replayed"
            )
        self.loss_module = loss_module
        self.prefix = prefix
        self.initial = {n: t.detach() for n, t in initial.items()}
        self.facts = facts
        self.attention_mask = attention_mask
        self.token_type_ids = token_type_ids
        self.table = table if table is not None and table.name in self.initial else None
        self._step = _STEPS[facts.optimizer]

    @property
    def uses_ids(self) -> bool:
        """Whether token ids change the result (a trained embedding table drifts the inputs)."""
        return self.table is not None

    def state_numel(self) -> int:
        """Entries one simulation keeps per candidate: weights and gradients (+ Adam moments)."""
        per_entry = 4 if self.facts.optimizer == "adam" else 2
        return per_entry * sum(t.numel() for t in self.initial.values())

    def table_rows(self, ids: torch.Tensor | None) -> TableRows | None:
        """The table rows a replay on ``ids`` must carry (None: the whole table, or no table
        drift at all). Under ``vmap`` pass the rows of the whole chunk, computed outside."""
        if self.table is None or ids is None or not self.table.input_only:
            return None
        return TableRows.of(ids, self.initial[self.table.name])

    def delta(
        self,
        embeds: torch.Tensor,
        labels: dict[str, torch.Tensor],
        ids: torch.Tensor | None = None,
        rows: TableRows | None = None,
        names: set[str] | None = None,
    ) -> Params:
        """``w_E - w_0`` of the trained parameters (those in ``names``, default all) after E
        epochs on ``embeds`` ([B, L, d]). ``rows`` carries only those table rows (see
        :meth:`table_rows`); the table's delta, if asked for, is then scattered back."""
        facts = self.facts
        params = dict(self.initial)
        if rows is not None:
            params[self.table.name] = rows.start
        start = dict(params)
        state: dict = {}
        for _ in range(facts.epochs):
            for batch_rows in facts.batches:
                grads = grad(self._batch_loss)(params, embeds, labels, ids, batch_rows, rows)
                params = self._step(params, grads, state, facts.lr)
        wanted = set(params) if names is None else set(params) & names
        out = {n: params[n] - start[n] for n in wanted}
        if rows is not None and self.table.name in out:
            dense = torch.zeros_like(self.initial[self.table.name])
            out[self.table.name] = dense.index_put((rows.index,), out[self.table.name])
        return out

    def pseudo_gradient(
        self,
        embeds: torch.Tensor,
        labels: dict[str, torch.Tensor],
        ids: torch.Tensor | None = None,
        rows: TableRows | None = None,
        names: set[str] | None = None,
    ) -> Params:
        """The simulated delta in gradient units, ``-delta / (steps * lr)``: the scale the
        received update is matched in (see ``GradientMatcher``)."""
        scale = -1.0 / (self.facts.steps * self.facts.lr)
        delta = self.delta(embeds, labels, ids, rows, names)
        return {n: scale * d for n, d in delta.items()}

    def _batch_loss(
        self,
        params: Params,
        embeds: torch.Tensor,
        labels: dict[str, torch.Tensor],
        ids: torch.Tensor | None,
        batch_rows: list[int],
        rows: TableRows | None,
    ) -> torch.Tensor:
        """The task loss of one local batch, trimmed to its longest row like the client's."""
        index = torch.tensor(batch_rows, device=embeds.device)
        mask = self.attention_mask[index]
        width = int(mask.sum(dim=1).max())
        inputs = embeds[index, :width]
        sub_ids = None if ids is None else ids[index, :width]
        carried = dict(params)
        if self.table is not None and sub_ids is not None:
            name = self.table.name
            if rows is None:
                drift = (params[name] - self.initial[name])[sub_ids]
            else:  # only the carried rows: the module keeps its own (unread) table
                drift = (carried.pop(name) - rows.start)[rows.local(sub_ids)]
            if self.table.padding_idx is not None:
                drift = drift * (sub_ids != self.table.padding_idx)[..., None]
            inputs = inputs + drift
        token_types = None if self.token_type_ids is None else self.token_type_ids[index, :width]
        named = {self.prefix + n: t for n, t in carried.items()}
        return functional_call(
            self.loss_module,
            named,
            (inputs, {k: v[index] for k, v in labels.items()}, sub_ids),
            {"attention_mask": mask[:, :width], "token_type_ids": token_types},
        )
