"""gradleak: how much private text leaks from federated fine-tuning updates."""

__version__ = "0.1.0"
