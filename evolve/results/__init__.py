"""What a run tells you: ``report`` (report.json and report.md), ``stats`` (is a gain more
than noise: paired comparisons over the same tasks, a score's interval) and ``pairing`` (which
tasks two runs share: the same id and content). The archive itself is ``evolve.archive``."""
