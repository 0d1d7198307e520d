"""Hostile inputs for graphopt: a corpus built on the fly (corpus.py) and a fast,
isolated way to run the command line on each (runner.py)."""
