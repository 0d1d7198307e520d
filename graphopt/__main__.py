"""`python -m graphopt ...` runs the command line."""

from graphopt.cli import main

if __name__ == "__main__":
    main()
