"""A node's worker side: the ranks it hosts, their supervisor and the runner processes."""
