"""The harness end to end: a tiny random HF Qwen2 on CPU through `infir-eval run`, scripted backends
for exact metrics and resume, the vLLM path with a fake engine, megatron input, compare, W&B."""
import json
import sys
import types
from pathlib import Path

import pytest
import torch

from infir.eval.backends import Completion, HFBackend, VLLMBackend, make_backend
from infir.eval.benchmarks import Sampling, get_benchmark, load_problems
from infir.eval.cli import main
from infir.eval.config import load_config
from infir.eval.runner import evaluate


def run_cli(capsys, *overrides):
    assert main(["run", *overrides]) == 0
    return capsys.readouterr().out


def test_end_to_end_tiny_qwen2_on_cpu(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    common = [f"model={tiny_model_dir}", "benchmarks=[demo_arith,gpqa_diamond,livecodebench_v5]", "source=samples",
              "limit=2", "sampling.n=2", "sampling.max_new_tokens=8", "pass_k=[1,2]", "backend.name=hf", "grading.workers=2"]
    printed = run_cli(capsys, *common, f"out_dir={out}")
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["benchmarks"]) == {"demo_arith", "gpqa_diamond", "livecodebench_v5"}
    for result in summary["benchmarks"].values():
        assert result["problems"] == 2 and result["samples"] == 2
        assert set(result) >= {"avg@2", "pass@1", "pass@2", "mean_tokens", "truncated"}
        assert 0 < result["mean_tokens"] <= 8
    assert (out / "report.md").read_text() in printed
    rows = [json.loads(l) for l in (out / "samples" / "gpqa_diamond.jsonl").read_text().splitlines()]
    assert len(rows) == 4
    for row in rows:
        assert row["prompt"].startswith("<|im_start|>user\n") and row["prompt"].endswith("<|im_start|>assistant\n")
        assert {"response", "extracted", "correct", "num_tokens", "finish_reason"} <= set(row)
    # same seed, same model: the same samples (generation is seeded per chunk)
    run_cli(capsys, *common, f"out_dir={tmp_path / 'again'}", "benchmarks=[gpqa_diamond]")
    again = [json.loads(l) for l in (tmp_path / "again" / "samples" / "gpqa_diamond.jsonl").read_text().splitlines()]
    assert [r["response"] for r in again] == [r["response"] for r in rows]


def test_hf_greedy_matches_a_plain_argmax_loop(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    backend = HFBackend(tiny_model_dir, tokenizer, device="cpu", batch_size=4)
    prompts = ["<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n", "<|im_start|>user\nHi<|im_end|>\n"]
    got = backend.generate(prompts, Sampling(n=1, temperature=0.0, max_new_tokens=6), seed=0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    for prompt, (completion,) in zip(prompts, got):
        ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
        new = []
        with torch.no_grad():
            for _ in range(6):
                token = int(model(ids).logits[0, -1].argmax())
                if token in backend.stop_ids:
                    break
                new.append(token)
                ids = torch.cat([ids, torch.tensor([[token]])], dim=1)
        assert completion.text == tokenizer.decode(new, skip_special_tokens=True)
        assert completion.num_tokens == len(new) + (completion.finish_reason == "stop")


class ScriptedBackend:
    """Answers from a table keyed by problem: sample i gets responses[i]; counts what it generated."""

    def __init__(self, problems, responses_for, fail_after: int | None = None):
        self.problems, self.responses_for, self.fail_after = problems, responses_for, fail_after
        self.generated: list[str] = []

    def generate(self, prompts, sampling, seed):
        out = []
        for prompt in prompts:
            if self.fail_after is not None and len(self.generated) >= self.fail_after:
                raise KeyboardInterrupt("simulated interruption")
            problem = next(p for p in self.problems if p.prompt in prompt)
            self.generated.append(problem.id)
            out.append([Completion(t, 5, "stop") for t in self.responses_for(problem)[:sampling.n]])
        return out


def gsm8k_config(tiny_model_dir, out_dir, *extra):
    return load_config([f"model={tiny_model_dir}", "benchmarks=[gsm8k]", "source=samples", "sampling.n=4",
                        "pass_k=[1,2,4]", f"out_dir={out_dir}", "backend.chunk_size=1", *extra])


def test_metrics_from_scripted_answers(tiny_model_dir, tmp_path):
    problems = load_problems(get_benchmark("gsm8k"), "samples")  # answers 26, 5000, 6
    right = {p.id: i for i, p in enumerate(problems)}  # problem i gets i right answers of 4

    def responses(p):
        return [f"</think>\\boxed{{{p.answer}}}" if s < right[p.id] else "</think>\\boxed{-1}" for s in range(4)]

    summary = evaluate(gsm8k_config(tiny_model_dir, tmp_path), backend=ScriptedBackend(problems, responses))
    r = summary["benchmarks"]["gsm8k"]
    assert r["avg@4"] == pytest.approx(100 * (0 + 1 + 2) / 12)
    assert r["pass@4"] == pytest.approx(100 * 2 / 3)
    assert r["pass@2"] == pytest.approx(100 * (0 + 0.5 + 5 / 6) / 3)
    assert summary["overall"]["avg"] == pytest.approx(r["avg@4"])


def test_interrupted_run_resumes_from_the_cache(tiny_model_dir, tmp_path):
    problems = load_problems(get_benchmark("gsm8k"), "samples")
    responses = lambda p: [f"\\boxed{{{p.answer}}}"] * 4  # noqa: E731
    first = ScriptedBackend(problems, responses, fail_after=2)
    with pytest.raises(KeyboardInterrupt):
        evaluate(gsm8k_config(tiny_model_dir, tmp_path), backend=first)
    cache = tmp_path / "samples" / "gsm8k.jsonl"
    with open(cache, "a") as f:
        f.write('{"benchmark": "gsm8k", "problem_id": "torn')  # a write cut short by the interruption
    second = ScriptedBackend(problems, responses)
    summary = evaluate(gsm8k_config(tiny_model_dir, tmp_path), backend=second)
    assert second.generated == [problems[2].id]  # only what the first run did not finish
    rows = [json.loads(l) for l in cache.read_text().splitlines()]
    assert sorted((r["problem_id"], r["sample"]) for r in rows) == sorted((p.id, s) for p in problems for s in range(4))
    assert summary["benchmarks"]["gsm8k"]["avg@4"] == 100.0


def test_resume_with_other_settings_is_refused(tiny_model_dir, tmp_path):
    problems = load_problems(get_benchmark("gsm8k"), "samples")
    backend = ScriptedBackend(problems, lambda p: ["\\boxed{1}"] * 4)
    evaluate(gsm8k_config(tiny_model_dir, tmp_path), backend=backend)
    with pytest.raises(ValueError, match="other settings.*temperature"):
        evaluate(gsm8k_config(tiny_model_dir, tmp_path, "sampling.temperature=1.0"), backend=backend)


class FakeSamplingParams:
    def __init__(self, **kwargs):
        self.kwargs = kwargs


class FakeLLM:
    """vLLM's offline API shape: generate(prompts, params) -> [RequestOutput(outputs=[CompletionOutput])]."""

    def __init__(self):
        self.calls = []

    def generate(self, prompts, params):
        self.calls.append((list(prompts), params.kwargs))
        n = params.kwargs["n"]
        return [types.SimpleNamespace(outputs=[
            types.SimpleNamespace(text=f"</think>\\boxed{{{i}}}", token_ids=[7] * (i + 1),
                                  finish_reason="length" if i == n - 1 else "stop") for i in range(n)])
            for _ in prompts]


def test_vllm_path_with_a_fake_engine(tiny_model_dir, tmp_path):
    engine = FakeLLM()
    backend = VLLMBackend(tiny_model_dir, engine=engine, sampling_params_cls=FakeSamplingParams)
    out = backend.generate(["a", "b"], Sampling(n=3, temperature=0.65, top_p=0.95, max_new_tokens=100), seed=11)
    assert engine.calls[0] == (["a", "b"], {"n": 3, "temperature": 0.65, "top_p": 0.95, "max_tokens": 100, "seed": 11})
    assert [[c.num_tokens for c in o] for o in out] == [[1, 2, 3]] * 2
    assert [c.finish_reason for c in out[0]] == ["stop", "stop", "length"]
    cfg = load_config([f"model={tiny_model_dir}", "benchmarks=[aime24]", "source=samples", f"out_dir={tmp_path}",
                       "sampling.n=3", "pass_k=[1]"])
    summary = evaluate(cfg, backend=backend)  # aime24 sample answers are 2, 16, 13: "\boxed{2}" hits one
    assert summary["benchmarks"]["aime24"]["avg@3"] == pytest.approx(100 / 9)
    assert summary["benchmarks"]["aime24"]["truncated"] == 3
    assert len(engine.calls[-1][0]) == 3  # one call for the whole chunk: vLLM batches it


def test_vllm_backend_without_vllm_says_how_to_install(monkeypatch, tiny_model_dir):
    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(ImportError, match="infir\\[vllm\\]"):
        make_backend("vllm", tiny_model_dir, tokenizer=None)


def test_megatron_checkpoint_is_converted_once(monkeypatch, tiny_model_dir, tmp_path):
    import shutil

    from infir.model import ckpt_format

    ckpt = tmp_path / "ckpt"
    (ckpt / "iter_0000010").mkdir(parents=True)
    ckpt_format.write_meta(ckpt / "iter_0000010", {"iteration": 10, "tp": 1})
    (ckpt / ckpt_format.LATEST).write_text("iter_0000010\n")
    conversions = []

    def mcore_to_hf(ckpt_dir, out_dir):
        conversions.append(Path(ckpt_dir))
        shutil.copytree(tiny_model_dir, out_dir)
        return Path(out_dir)

    monkeypatch.setitem(sys.modules, "infir.model.convert", types.SimpleNamespace(mcore_to_hf=mcore_to_hf))
    problems = load_problems(get_benchmark("gsm8k"), "samples")
    for _ in range(2):
        cfg = gsm8k_config(ckpt, tmp_path / "run")
        evaluate(cfg, backend=ScriptedBackend(problems, lambda p: ["\\boxed{1}"] * 4))
    assert conversions == [ckpt]
    assert (tmp_path / "run" / "hf_model" / "config.json").is_file()


def test_compare_puts_runs_side_by_side(tmp_path, capsys):
    for label, scores in {"bf16": (40.0, 30.0), "fp8": (41.5, 29.0)}.items():
        (tmp_path / label).mkdir()
        summary = {"label": label, "model": label, "seed": 0, "overall": {"avg": sum(scores) / 2},
                   "benchmarks": {"aime24": {"avg@32": scores[0], "pass@1": scores[0]},
                                  "gpqa_diamond": {"avg@8": scores[1], "pass@1": scores[1]}}}
        (tmp_path / label / "summary.json").write_text(json.dumps(summary))
    assert main(["compare", str(tmp_path / "bf16"), str(tmp_path / "fp8"), "--out", str(tmp_path / "t.md")]) == 0
    table = capsys.readouterr().out
    assert "| run | aime24 | gpqa_diamond | overall |" in table
    assert "| bf16 | 40.00 | 30.00 | 35.00 |" in table
    assert "| fp8 | 41.50 (+1.50) | 29.00 (-1.00) | 35.25 |" in table
    assert (tmp_path / "t.md").read_text() == table
    assert main(["compare", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == f"infir-eval compare: error: {tmp_path}: no summary.json (is it an `infir-eval run` output directory?)\n"


def test_wandb_gets_metrics_and_a_sample_table(monkeypatch, tiny_model_dir, tmp_path):
    logged = {}

    class Table:
        def __init__(self, columns, data):
            self.columns, self.data = columns, data

    run = types.SimpleNamespace(summary={}, log=lambda d: logged.update(d), finish=lambda: logged.setdefault("finished", True))
    fake = types.SimpleNamespace(init=lambda **kw: logged.setdefault("init", kw) and run, Table=Table)
    monkeypatch.setitem(sys.modules, "wandb", fake)
    problems = load_problems(get_benchmark("gsm8k"), "samples")
    cfg = gsm8k_config(tiny_model_dir, tmp_path, "wandb.enabled=true")
    evaluate(cfg, backend=ScriptedBackend(problems, lambda p: [f"\\boxed{{{p.answer}}}"] * 4))
    assert logged["init"]["mode"] == "offline" and logged["finished"]
    table = logged["samples/gsm8k"]
    assert len(table.data) == 12 and "response" in table.columns
    assert run.summary["gsm8k/avg@4"] == 100.0


def test_config_errors_name_the_problem(tmp_path):
    with pytest.raises(ValueError, match="model="):
        load_config(["benchmarks=[aime24]"])
    with pytest.raises(Exception, match="sampling.nn"):
        load_config(["model=x", "sampling.nn=3"])
    with pytest.raises(Exception, match="sampling.n"):
        load_config(["model=x", "sampling.n=many"])
    with pytest.raises(FileNotFoundError, match="known presets"):
        load_config(["model=x", "preset=nope"])
    cfg = load_config(["model=x", "preset=demo", "sampling.n=3"])
    assert cfg.benchmarks == ["demo_arith", "gsm8k"] and cfg.sampling.n == 3 and cfg.backend.name == "hf"


def test_eval_yaml_states_the_schema_defaults():
    from omegaconf import OmegaConf

    from infir.eval.config import EvalConfig, conf_dir

    from_yaml = OmegaConf.merge(OmegaConf.structured(EvalConfig), OmegaConf.load(conf_dir() / "eval.yaml"))
    assert OmegaConf.to_container(from_yaml) == OmegaConf.to_container(OmegaConf.structured(EvalConfig))


def test_list_and_help(capsys):
    assert main(["list"]) == 0
    listed = capsys.readouterr().out
    for name in ("aime24", "aime25", "gpqa_diamond", "livecodebench_v5", "math500", "gsm8k", "demo_arith"):
        assert name in listed
    assert main([]) == 2 and "infir-eval run" in capsys.readouterr().out
    assert main(["evaluate"]) == 2 and "unknown command" in capsys.readouterr().err
