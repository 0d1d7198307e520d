"""Decisions by measurement (DESIGN.md): rewrites that can cost time are chosen from a
shipped cost table or, with `--tune`, by timing the candidates on the target."""

from graphopt.decisions.point import NOISE_MARGIN, Build, DecisionPoint, signature_of
from graphopt.decisions.shapes import OpClass, conv_class, conv_worlds
from graphopt.decisions.table import CostTable, Entry, default_table
from graphopt.decisions.tune import EP_OF_TARGET, OrtTimer, Timer, TuneCache, default_cache_path

__all__ = [
    "NOISE_MARGIN",
    "Build",
    "DecisionPoint",
    "signature_of",
    "OpClass",
    "conv_class",
    "conv_worlds",
    "CostTable",
    "Entry",
    "default_table",
    "EP_OF_TARGET",
    "OrtTimer",
    "Timer",
    "TuneCache",
    "default_cache_path",
]
