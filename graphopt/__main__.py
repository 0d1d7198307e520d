"""`python -m graphopt ...` runs the command line."""

import gc

gc.disable()  # graphopt.cli.main keeps it off for the start-up, then turns it back on
from graphopt.cli import run  # noqa: E402

# Frozen first: the first collection after a pause walks every object made during it
# (the command line's ~100,000), some 3-9 ms at the next allocation for nothing.
gc.freeze()
gc.enable()

if __name__ == "__main__":
    run()
