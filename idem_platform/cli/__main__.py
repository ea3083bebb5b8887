"""``python -m idem_platform.cli``: the ``idem`` command."""

from idem_platform.cli import run

if __name__ == "__main__":
    run()
