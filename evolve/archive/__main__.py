"""``python -m evolve.archive bench [N_SYSTEMS] [N_TRAJECTORIES] [small|text|logprobs] [ZLEVEL]``"""

from evolve.archive.bench import _bench

if __name__ == "__main__":  # pragma: no cover
    import sys

    if sys.argv[1:2] != ["bench"]:
        sys.exit("usage: python -m evolve.archive bench [N_SYSTEMS] [N_TRAJECTORIES] [small|text|logprobs] [ZLEVEL]")
    argv = sys.argv[2:]
    _bench(
        int(argv[0]) if len(argv) > 0 else 10_000,
        int(argv[1]) if len(argv) > 1 else 100_000,
        argv[2] if len(argv) > 2 else "text",
        int(argv[3]) if len(argv) > 3 else 0,
    )
