"""What a process computes with: the device (:mod:`~gradleak.runtime.devices`), torch's global
state kept for the caller (:mod:`~gradleak.runtime.state`), the machine and library versions a
result records (:mod:`~gradleak.runtime.environment`) and progress bars
(:mod:`~gradleak.runtime.progress`)."""
