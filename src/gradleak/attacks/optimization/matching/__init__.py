"""What the optimization attacks match: the target tensors of an update (:mod:`~.targets`), the
distances (:mod:`~.distances`), the dummy loss (:mod:`~.dummy_loss`), the simulated local
training of a FedAvg client (:mod:`~.simulation`) and the matcher that joins them
(:mod:`~.objective`)."""
