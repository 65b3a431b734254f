"""vLLM against LocalLM on the same trained program, in one process: evaluation throughput, MAPGRPO step phases,
and the peak memory of a compile whose rollouts run on the engine.

Run it alone on the machine (it gives both cores to whichever engine is running):

    .venv/bin/python benchmarks/bench_vllm.py --program runs/demo-sft/program
    # runs/demo-sft/program: `rolecall demo --optimizer sft --out runs/demo-sft` saves the SFT-trained OPERA there

For each engine in turn (LocalLM first, then vLLM, each loaded alone; vLLM with ``VLLM_CPU_NUM_OF_RESERVED_CPU=0``,
both cores to its worker):

1. evaluation: the program on ``--questions`` held-out synthetic questions (seed-0 world, test split), greedy, the
   demo's 24 threads: questions per minute, EM / F1, LM calls and generated tokens; then the two runs are compared
   question by question (won / lost, paired bootstrap interval of the EM difference, McNemar p);
2. MAPGRPO on the SFT warm start: one plan step and one analysis step at the same G, seed and inputs, with the time of
   each phase (``time/generate``, ``time/execute``, ``time/update``, ...) from ``metrics.jsonl``, and the adapter
   publish cost (vLLM);
3. peak resident memory of this process plus the engine's processes while step 2 runs (sampled every 0.2 s).
   After step 1 in the same process that peak carries what the evaluation left behind; ``--skip-eval`` measures a
   compile alone (``benchmarks/results/vllm_cpu_compile.json``).

Writes ``benchmarks/results/vllm_cpu.json`` (or the ``--out`` given): each engine's numbers and the vLLM / LocalLM
ratios. The ratio of evaluation throughput is the figure ``--engine auto`` relies on (``rolecall/lm/engines.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _common import bench_parser, repo_relative, write_results


def _rss_bytes(pid: int) -> int:
    """Resident memory of process ``pid`` and all its descendants."""
    import psutil

    try:
        proc = psutil.Process(pid)
        procs = [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


class PeakMemory:
    """Samples the resident memory of this process tree every ``interval`` seconds while entered."""

    def __init__(self, interval: float = 0.2) -> None:
        self.interval, self.peak = interval, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _rss_bytes(os.getpid()))
            self._stop.wait(self.interval)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()


def _evaluate(program: Any, lm: Any, questions: Sequence[Any], out: Path, threads: int) -> dict[str, Any]:
    import dspy

    from rolecall.evaluation import evaluate

    start = time.perf_counter()
    with dspy.context(lm=lm):
        result = evaluate(program, questions, num_threads=threads, output_dir=out, show_progress=True)
    seconds = time.perf_counter() - start
    summary = result.summary.to_dict() if hasattr(result.summary, "to_dict") else dict(result.summary)
    return {
        "seconds": seconds,
        "questions": len(questions),
        "questions_per_min": 60.0 * len(questions) / seconds,
        "em": summary.get("em"),
        "f1": summary.get("f1"),
        "lm_calls": summary.get("lm_calls"),
        "completion_tokens": summary.get("completion_tokens"),
        "prompt_tokens": summary.get("prompt_tokens"),
        "generated_tokens_per_s": (summary.get("completion_tokens") or 0.0) * len(questions) / seconds
        if summary.get("completion_tokens") is not None
        else None,
        "records": repo_relative(out),
    }


def _rl_steps(program: Any, world: Any, out: Path, group_size: int, threads: int) -> dict[str, Any]:
    from rolecall.optimizers import MAPGRPO, MAPGRPOConfig

    optimizer = MAPGRPO(
        MAPGRPOConfig(
            group_size=group_size,
            steps={"plan": 1, "analysis": 1, "rewrite": 0},
            output_dir=out,
            seed=0,
            num_threads=threads,
            show_progress=False,
        )
    )
    with PeakMemory() as memory:
        start = time.perf_counter()
        program.compile(optimizer=optimizer, trainset=world.train)
        seconds = time.perf_counter() - start
    steps = {}
    for line in (out / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        stage = record.get("stage")
        if stage in ("plan", "analysis") and stage not in steps:
            steps[stage] = {k: v for k, v in record.items() if k.startswith(("time/", "vllm/", "mismatch/"))}
            steps[stage]["groups/total"] = record.get("groups/total")
    return {"seconds": seconds, "steps": steps, "peak_rss_gib": memory.peak / (1 << 30)}


def run_engine(engine: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Evaluate and train on one engine, then stop it."""
    from rolecall.data.synthetic import synthetic_world
    from rolecall.lm.engines import close_lm, make_lm
    from rolecall.optimizers.core.checkpoint import seed_everything
    from rolecall.programs import OPERA
    from rolecall.retrievers.bm25 import BM25

    world = synthetic_world(seed=0)
    questions = world.test[: args.questions]
    started = time.perf_counter()
    lm = make_lm(args.model, engine=engine)
    load_s = time.perf_counter() - started
    retriever = BM25(world.corpus)
    program = OPERA.load(args.program, retriever=retriever, lm=lm)
    out: dict[str, Any] = {"engine": type(lm).__name__, "load_s": load_s}
    if not args.skip_eval:
        out["eval"] = _evaluate(program, lm, questions, work / f"eval-{engine}", args.threads)
        print(f"{engine}: eval {out['eval']}", flush=True)
    if not args.skip_rl:
        seed_everything(0)
        fresh = OPERA.load(args.program, retriever=retriever, lm=lm)
        out["mapgrpo"] = _rl_steps(fresh, world, work / f"mapgrpo-{engine}", args.group_size, args.threads)
        print(f"{engine}: mapgrpo {out['mapgrpo']}", flush=True)
    close_lm(lm)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = bench_parser(__doc__, "vllm_cpu")
    parser.add_argument("--program", type=Path, required=True, help="a saved SFT-trained OPERA (program.json)")
    parser.add_argument("--model", default=None, help="base model (default: the embedded SmolLM2)")
    parser.add_argument("--questions", type=int, default=200, help="held-out questions (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=24, help="concurrent questions (default: %(default)s)")
    parser.add_argument("--group-size", type=int, default=4, help="MAPGRPO G (default: %(default)s)")
    parser.add_argument("--engines", default="local,vllm", help="engines in order (default: %(default)s)")
    parser.add_argument("--skip-rl", action="store_true", help="evaluation only")
    parser.add_argument("--skip-eval", action="store_true", help="MAPGRPO steps only (a compile's own peak memory)")
    parser.add_argument("--work", type=Path, default=None, help="run folders (default: a temporary one)")
    args = parser.parse_args(argv)
    if not (args.program / "program.json").is_file():
        print(f"bench_vllm: {args.program} holds no program.json; see --help for how to make one", file=sys.stderr)
        return 2
    os.environ.pop("ROLECALL_ENGINE", None)
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-vllm-"))
    results: dict[str, Any] = {"engines": {}}
    for engine in args.engines.split(","):
        results["engines"][engine] = run_engine(engine, args, work)
    engines = results["engines"]
    if "local" in engines and "vllm" in engines:
        from rolecall.evaluation.compare import compare_runs, format_comparison

        local, vllm = engines["local"], engines["vllm"]
        ratios: dict[str, float] = {}
        if "eval" in local and "eval" in vllm:
            paired = compare_runs(work / "eval-local", work / "eval-vllm")
            results["paired_eval"] = {**paired.to_dict(), "text": format_comparison(paired)}
            ratios["eval_questions_per_min"] = vllm["eval"]["questions_per_min"] / local["eval"]["questions_per_min"]
        if "mapgrpo" in local and "mapgrpo" in vllm:
            ratios["compile_peak_rss local/vllm"] = local["mapgrpo"]["peak_rss_gib"] / vllm["mapgrpo"]["peak_rss_gib"]
            for stage in ("plan", "analysis"):
                a, b = local["mapgrpo"]["steps"].get(stage, {}), vllm["mapgrpo"]["steps"].get(stage, {})
                for key in ("time/generate", "time/execute", "time/update", "time/step"):
                    if a.get(key) and b.get(key):
                        ratios[f"{stage}/{key} local/vllm"] = a[key] / b[key]
        results["ratios"] = ratios
        print(json.dumps(ratios, indent=2))
        if "paired_eval" in results:
            print(results["paired_eval"]["text"])
    path = write_results(results, args)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":  # vLLM starts its engine in a spawned process, which imports this file again
    sys.exit(main())
