"""gradleak where federated fine-tuning already runs: inside a Flower federation
(:mod:`gradleak.integrations.flower`, the ``flower`` extra)."""
