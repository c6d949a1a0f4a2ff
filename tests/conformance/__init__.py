"""The conformance suite every store must pass."""
