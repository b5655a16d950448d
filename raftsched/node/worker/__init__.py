"""What runs on this node: starts, the spawn gate, executions (a process through the guard,
an HTTP request, a callable), their output and logs, the guard, heartbeats and the self-
fence, death certificates."""
