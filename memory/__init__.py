"""Memory layer (issue: experience memory with ADD / MERGE / DELETE as an event log, Reflexion mode). Not built yet."""
