"""`python -m dlqapp …` is `faust -A dlqapp …`."""

from __future__ import annotations


def main() -> None:
    """Run Faust's command line with this app."""
    import dlqapp

    dlqapp.app.main()


if __name__ == "__main__":
    main()
