"""Topology layer (issue: workflow graphs and MCTS search over them). Not built yet."""
