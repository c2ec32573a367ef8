"""One attack run, from a config to a record: the recipe of one input
(:mod:`~gradleak.running.recipe`), the run over inputs with resume, workers and Ray
(:mod:`~gradleak.running.runner`, :mod:`~gradleak.running.distributed`), the results on disk
(:mod:`~gradleak.running.store`) and the typed record (:mod:`~gradleak.running.record`)."""
