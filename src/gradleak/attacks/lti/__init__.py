"""Learning to Invert (Wu et al. 2023): an inversion model trained on the server's own
updates of auxiliary (LTI) or pseudo (LTI-P) text, applied to a client's update."""
