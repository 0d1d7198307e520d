"""`python -m graphopt ...` runs the command line."""

import gc

gc.disable()  # graphopt.cli.main keeps it off for the start-up, then turns it back on
from graphopt.cli import run  # noqa: E402

gc.enable()

if __name__ == "__main__":
    run()
