"""What a run tells you: ``report`` (report.json and report.md) and ``stats`` (is a gain more
than noise: paired comparisons over the same tasks). The archive itself is ``evolve.archive``."""
