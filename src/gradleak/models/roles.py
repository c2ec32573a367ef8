"""The roles attacks and the federated client speak in, as Li, Xu & Dras 2024 name the modules
of a transformer layer: ``q``, ``k``, ``v`` (attention projections), ``o`` (attention output),
``f`` (FFN input) and ``p`` (FFN output). Each family's adapter
(:mod:`gradleak.models.adapters`) maps them onto its modules; a protocol names them (LoRA's
roles, what is shared) without loading a model."""

ROLES: tuple[str, ...] = ("q", "k", "v", "o", "f", "p")
