"""One benchmark suite: a harness (:mod:`.harness`), a manifest of benchmark definitions
(:mod:`.manifest`), the runners of each kind (:mod:`.kinds`), the results page (:mod:`.page`) and one
command line (``python -m experiments.bench``)."""
