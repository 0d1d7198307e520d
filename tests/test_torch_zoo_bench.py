"""benchmarks/torch_zoo.py on CPU: a tiny run of one zoo model records graphopt/inductor ratios,
rewrites and compile seconds; a failing variant is recorded and the run goes on; the table's
summary rows; the model list and shards; bad arguments are a usage error. (The timed figures
come from `bash benchmarks/gpu_session.sh torch-zoo ...` and the CPU run in RESULTS.md.)"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch_zoo  # noqa: E402


def test_tiny_cpu_run_records_ratio_rewrites_and_compile_cost(tmp_path: Path) -> None:
    out = tmp_path / "zoo.json"
    assert torch_zoo.main(["--device", "cpu", "--tiny", "--models", "distilbert", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["settings"]["dtypes"] == ["fp32"] and data["not_started"] == []
    [result] = data["results"]
    assert result["model"] == "distilbert" and result["inputs"]["input_ids"] == [1, torch_zoo.TINY_SEQ]
    ratio = result["ratios"]["default"]
    assert ratio["ratio"] > 0 and ratio["remeasured"] == 0
    graphopt = result["variants"]["graphopt/default"]
    assert graphopt["status"] == "ok" and graphopt["max_rel_diff"] < 1e-3
    # DistilBERT's attention and LayerNorms are graphopt's: rewrites, counted per mode
    assert sum(graphopt["graphopt"]["rewrites"].values()) > 0
    assert all(key.startswith("default:") for key in result["rewrites"]) and result["rewrites"]
    cost = result["compile"]["default"]
    assert cost["inductor_s"] > 0 and cost["graphopt_s"] > 0 and 0 < cost["passes_s"] < cost["graphopt_s"]
    assert ratio["ratio"] == pytest.approx(graphopt["median_ms"] / result["variants"]["inductor/default"]["median_ms"])


def test_a_failing_variant_is_recorded_and_the_run_goes_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = torch_zoo.compile_variant

    def broken(model: Any, variant: str) -> Any:
        if variant.startswith("graphopt"):
            raise RuntimeError("boom")
        return real(model, variant)

    monkeypatch.setattr(torch_zoo, "compile_variant", broken)
    out = tmp_path / "zoo.json"
    assert torch_zoo.main(["--device", "cpu", "--tiny", "--models", "rnn-tagger", "--out", str(out)]) == 0
    [result] = json.loads(out.read_text())["results"]
    assert result["variants"]["graphopt/default"]["status"] == "error: RuntimeError: boom"
    assert "median_ms" in result["variants"]["inductor/default"] and result["ratios"]["default"]["ratio"] is None


def _result(model: str, ratios: dict[str, float]) -> dict[str, Any]:
    variants = {}
    for mode, r in ratios.items():
        variants[f"inductor/{mode}"] = {"median_ms": 1.0, "numerics_ok": True}
        variants[f"graphopt/{mode}"] = {"median_ms": r, "numerics_ok": True}
    return {"model": model, "dtype": "fp16", "variants": variants, "ratios": {m: {"ratio": r, "within_noise": abs(r - 1) < 0.03}
                                                                              for m, r in ratios.items()},
            "best_over_best": min(ratios.values()), "rewrites": {"default:x": 2}, "compile": {}}


def test_table_summarises_geomean_worst_and_losses() -> None:
    results = [_result("a", {"default": 0.5, "max-autotune": 1.02}), _result("b", {"default": 2.0, "max-autotune": 1.10}),
               _result("c", {"default": 1.05, "max-autotune": 0.9})]
    text = torch_zoo.table(results, ["default", "max-autotune"], "GPU NVIDIA H100")
    lines = text.splitlines()
    assert lines[0] == "device: GPU NVIDIA H100"
    geomean = next(line for line in lines if line.startswith("geomean")).split()
    assert geomean[1] == f"{(0.5 * 2.0 * 1.05) ** (1 / 3):.3f}"
    worst = next(line for line in lines if line.startswith("worst"))
    assert "2.000 b" in worst and "1.100 b" in worst
    losses = next(line for line in lines if line.startswith("> 1.03x"))
    assert losses.split()[2:] == ["2", "of", "3", "1", "of", "3"]
    assert "1.020~" in next(line for line in lines if line.startswith("a "))


def test_model_list_is_one_model_per_family_and_shards_split_it() -> None:
    models = torch_zoo.zoo_models()
    names = [m.name for m in models]
    assert len(names) == len(set(names))
    assert next(m for m in models if m.name == "bert").zoo_names == ["bert-dynamo", "bert-torchscript"]
    assert {"resnet-torchscript", "resnet-dynamo", "unet-block", "llama"} <= set(names)
    shards = []
    for i in (1, 2, 3):
        args = torch_zoo._parse(["--shard", f"{i}/3"])
        assert not isinstance(args, str)
        selected = torch_zoo.select_models(args)
        assert not isinstance(selected, str)
        shards.append([m.name for m in selected])
    assert sorted(sum(shards, [])) == sorted(names)


@pytest.mark.parametrize("argv", [["--modes", "fast"], ["--models", "nope"], ["--shard", "3/2"], ["--dtypes", "fp8", "--device", "cpu"]])
def test_bad_arguments_are_a_usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert torch_zoo.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ")
