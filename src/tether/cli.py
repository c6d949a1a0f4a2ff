"""The ``tether`` command (placeholder until the CLI lands)."""


def main() -> None:
    """Entry point."""
    raise SystemExit("tether CLI")
