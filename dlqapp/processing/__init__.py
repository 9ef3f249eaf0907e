"""The request path: intake and dedup, the attempt, carrying out outcomes, in-flight windows."""
