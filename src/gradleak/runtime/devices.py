"""Where a run computes: the device name a user gives, checked, and random draws that do not
depend on it.

A run's tensors live on one device, the global model's: the client's update, the attack's
dummy inputs and its LM prior follow the model, and nothing in the attacks names a device of
its own. Random numbers are drawn on the CPU from the run's seeded generator and then moved,
so that the same seed starts an attack from the same point on every device (a GPU's own
generators would give other numbers), and a GPU run can be compared with a CPU one.
"""

from __future__ import annotations

import torch

from gradleak.errors import GradleakError

DEVICE_KINDS = ("cpu", "cuda", "cuda:N", "mps")


def resolve_device(name: str | torch.device) -> torch.device:
    """The torch device ``name`` names (``cpu``, ``cuda``, ``cuda:N``, ``mps``), checked to
    be present on this machine."""
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise GradleakError(
            f"unknown device '{name}': use one of {', '.join(DEVICE_KINDS)}"
        ) from None
    if device.type == "cpu":
        return torch.device("cpu")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise GradleakError(
                f"device '{name}' needs CUDA, which this machine's torch does not see: "
                "use --device cpu (or install a CUDA build of torch on a GPU machine)"
            )
        count = torch.cuda.device_count()
        index = 0 if device.index is None else device.index
        if index >= count:
            raise GradleakError(
                f"device '{name}' does not exist: this machine has {count} CUDA "
                f"device{'s' if count != 1 else ''} (cuda:0 to cuda:{count - 1})"
            )
        return torch.device("cuda", index)
    if device.type == "mps":
        if not torch.backends.mps.is_available():
            raise GradleakError(
                f"device '{name}' needs Apple's MPS backend, which is not available here: "
                "use --device cpu"
            )
        return device
    raise GradleakError(f"device '{name}' is not supported: use one of {', '.join(DEVICE_KINDS)}")


def randn(
    *shape: int,
    generator: torch.Generator,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Standard normal draws from ``generator`` (a CPU generator), placed on ``device``: the
    same numbers on every device."""
    return torch.randn(*shape, generator=generator, dtype=dtype, device="cpu").to(device)


def randint(
    high: int, shape: tuple[int, ...], *, generator: torch.Generator, device: torch.device | str
) -> torch.Tensor:
    """Integers in [0, ``high``) from ``generator`` (CPU), placed on ``device``."""
    return torch.randint(high, shape, generator=generator, device="cpu").to(device)


def randperm(n: int, *, generator: torch.Generator, device: torch.device | str) -> torch.Tensor:
    """A random permutation of ``n`` from ``generator`` (CPU), placed on ``device``."""
    return torch.randperm(n, generator=generator, device="cpu").to(device)


def noise_generator(generator: torch.Generator, device: torch.device | str) -> torch.Generator:
    """A generator for a library that draws its noise on ``device`` itself (opacus): on the
    CPU ``generator`` as it is; elsewhere a generator on ``device`` seeded from it, so the
    run stays seeded (its numbers then differ from the CPU's, as the device's own do)."""
    device = torch.device(device)
    if device.type == "cpu":
        return generator
    seed = int(torch.randint(2**62, (1,), generator=generator, device="cpu"))
    return torch.Generator(device=device).manual_seed(seed)
