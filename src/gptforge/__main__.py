"""``python -m gptforge ...`` is the same as the ``gptforge`` console script."""

from gptforge.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
