"""What a run tells you: ``report`` (report.json and report.md), ``stats`` (is a gain more
than noise: paired comparisons over the same tasks, a score's interval), ``pairing`` (which
tasks two runs share: the same id and content) and ``rescore`` (finished runs' systems scored on a
larger test split, paired: ``python -m evolve.results.rescore``). The archive itself is ``evolve.archive``."""
