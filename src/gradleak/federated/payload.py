"""What a client sends and the server receives of an update: named tensors and the protocol
facts that travel with them. Defenses transform it on the client; attacks read it on the
server; the public :class:`gradleak.Update` wraps it with what the server knows of the round."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class UpdatePayload:
    """What the server receives of one update: named tensors plus the round's protocol metadata.

    ``kind`` is ``gradient`` (FedSGD) or ``weight_delta`` (FedAvg: new minus old weights).
    """

    kind: str
    tensors: dict[str, torch.Tensor]
    metadata: dict[str, Any] = field(default_factory=dict)
