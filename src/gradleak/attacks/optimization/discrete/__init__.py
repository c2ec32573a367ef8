"""LAMP's discrete side: the token reorderings of a round (:mod:`~.moves`), the language-model
prior (:mod:`~.prior`), and candidates scored by their matching loss (:mod:`~.candidate_scoring`,
:mod:`~.row_scoring`)."""
