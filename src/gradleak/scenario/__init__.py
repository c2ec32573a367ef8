"""A scenario's config made concrete, shared by attack runs and utility measurements: the
private examples the clients hold and how they are batched (:mod:`~gradleak.scenario.examples`)."""
