"""How a result is judged: reconstructions against the private text
(:mod:`~gradleak.evaluation.metrics`), and what a protocol and its defenses cost the model
(:mod:`~gradleak.evaluation.utility`)."""
