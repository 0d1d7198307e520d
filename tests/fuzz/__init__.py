"""Differential fuzzing of graphopt's ONNX optimizer.

`graphs` generates random valid ONNX models (hypothesis strategies), biased toward
the subgraphs the rules match; `differential` runs a model before and after
optimization in onnxruntime and compares. The tests are tests/test_fuzz_differential.py
(RELIABILITY.md says how to run the long profile); bugs found are pinned in
tests/test_fuzz_regressions.py. Nothing here imports graphopt except `differential`.
"""
