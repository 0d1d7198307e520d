"""Thin shim so `python cli.py ...` works from a checkout; the CLI lives in graphopt/cli.py."""

from graphopt.cli import run

if __name__ == "__main__":
    run()
