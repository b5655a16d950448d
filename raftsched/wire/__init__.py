"""The client API on the wire: the node's TCP server and the blocking client."""
