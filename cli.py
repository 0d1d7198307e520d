"""Thin shim so `python cli.py ...` works from a checkout; the CLI lives in graphopt/cli.py."""

from graphopt.cli import main

if __name__ == "__main__":
    main()
