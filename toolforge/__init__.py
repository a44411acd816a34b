"""Tool layer (issue: tools the agent writes, tests in the sandbox, keeps and retires). Not built yet."""
