"""Gradient-matching losses without forming the dummy gradient: the ghost statistics of each
linear layer (:mod:`~.statistics`, :mod:`~.rules`), low-rank targets (:mod:`~.low_rank`) and
the L1 term streamed a block of rows at a time (:mod:`~.streamed`)."""
