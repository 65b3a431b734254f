"""The plan stage's execute phase (f_exec of OPERA Eq. 7) with and without sharing solved sub-goals, one process.

A MAPGRPO plan step executes each input's G - 1 sampled plans and the gold expert plan downstream (analysis,
rewrite, synthesis), all in one concurrent wave. Candidates of one question often share a filled-in sub-goal; with
``share_sub_goals`` (the default) it is solved once per wave and its answer reused. This bench loads a trained OPERA
(the SFT warm start ``bench_compile.py`` saves), samples the plans of ``--steps`` plan steps of ``--inputs`` training
questions each exactly as MAPGRPO's generate phase does, and times executing each step's wave with both settings in
alternation (off, on, on, off, ... over ``--rounds``; a fresh execution cache every time), checking that both give
the same answers. Writes ``benchmarks/results/bench_plan_execution.json``.

Example:
    .venv/bin/python benchmarks/bench_plan_execution.py --steps 3 --rounds 2
"""

from __future__ import annotations

import dataclasses
import random
import statistics
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from _common import REPO, bench_parser, repo_relative, write_results

WARM_START = REPO / "runs" / "bench_compile" / "synthetic" / "opera" / "sft" / "program"


def main() -> None:
    parser = bench_parser(__doc__, "bench_plan_execution")
    parser.add_argument("--program", type=Path, default=WARM_START,
                        help="a saved OPERA program (default: bench_compile's SFT warm start, "
                        "runs/bench_compile/synthetic/opera/sft/program)")  # fmt: skip
    parser.add_argument("--steps", type=int, default=3, help="plan steps whose waves are timed (default 3)")
    parser.add_argument("--inputs", type=int, default=4, help="questions per step (default 4)")
    parser.add_argument("--group-size", type=int, default=4, help="G, c_best included (default 4)")
    parser.add_argument("--rounds", type=int, default=2, help="timed executions per setting and step (default 2)")
    parser.add_argument("--threads", type=int, default=24, help="concurrent plan executions (default 24)")
    args = parser.parse_args()
    if not (args.program / "program.json").is_file():
        raise SystemExit(f"no saved program at {args.program}: run `benchmarks/bench_compile.py --programs opera "
                         "--methods sft` first, or pass --program DIR")  # fmt: skip

    from rolecall.data.synthetic import synthetic_world
    from rolecall.lm import LocalLM
    from rolecall.optimizers import MAPGRPO, MAPGRPOConfig
    from rolecall.optimizers.mapgrpo import _parse, plan_wave
    from rolecall.optimizers.mapgrpo_roles import OperaRoleTasks, as_gold_record
    from rolecall.programs.registry import get_program_class
    from rolecall.retrievers.bm25 import BM25

    world = synthetic_world(seed=0)
    program = get_program_class("opera").load(args.program, retriever=BM25(world.corpus), lm=LocalLM())
    config = MAPGRPOConfig(group_size=args.group_size, inputs_per_step=args.inputs, num_threads=args.threads,
                           collect_questions=args.steps * args.inputs, show_progress=False)  # fmt: skip
    sampler = MAPGRPO(config)  # its generate phase, on the loaded program
    sampler.program, sampler.views = program, sampler._role_views(program)
    sampler.tasks = OperaRoleTasks(program, config)
    records = [as_gold_record(e) for e in world.train]
    inputs = sampler.tasks.collect("plan", records, random.Random("bench-plan-execution"))
    ctx = SimpleNamespace(stage=SimpleNamespace(name="plan"))

    signature = program.roles["plan"].signature
    waves = []
    for step in range(args.steps):
        ctx.step = step + 1
        batch = inputs[step * args.inputs : (step + 1) * args.inputs]
        generated = sampler.generate(ctx, batch)
        outputs = [[_parse(generated["adapter"], signature, c.text) for c in group] for group in generated["groups"]]
        gold = [sampler.tasks.gold_expert("plan", item) for item in batch]
        wave = plan_wave(batch, outputs, [[] for _ in batch], gold)  # the wave MAPGRPO.execute runs
        waves.append(list(dict.fromkeys((q, tuple(p)) for q, p in wave)))  # distinct, as the cache leaves them

    seconds: dict[bool, list[list[float]]] = {False: [], True: []}  # [wave][round]
    answers: dict[bool, list[list[str | None]]] = {False: [], True: []}
    counts = {"sub_goals_solved": 0, "sub_goals_shared": 0}
    for i, wave in enumerate(waves):
        for share in (False, True):
            seconds[share].append([])
        for r in range(args.rounds):
            for share in (False, True) if r % 2 == 0 else (True, False):  # alternate which setting goes first
                tasks = OperaRoleTasks(program, dataclasses.replace(config, share_sub_goals=share))
                t0 = time.perf_counter()
                answers[share].append(tasks.execute_plans([(q, list(p)) for q, p in wave]))
                seconds[share][-1].append(time.perf_counter() - t0)
                if share:
                    for k in counts:
                        counts[k] += tasks.execution_stats.get(k, 0)
        off, on = statistics.mean(seconds[False][-1]), statistics.mean(seconds[True][-1])
        print(f"step {i + 1}: {len(wave)} distinct plans, execute {off:.1f} s -> {on:.1f} s", flush=True)

    mean = {s: [statistics.mean(v) for v in seconds[s]] for s in (False, True)}
    runs = len(waves) * args.rounds
    same = sum(a == b for a, b in zip(answers[False], answers[True], strict=True))
    results: dict[str, Any] = {
        "waves": len(waves),
        "plans_per_wave": [len(w) for w in waves],
        "execute_s_off": [round(v, 2) for v in mean[False]],
        "execute_s_on": [round(v, 2) for v in mean[True]],
        "mean_execute_s_off": round(statistics.mean(mean[False]), 2),
        "mean_execute_s_on": round(statistics.mean(mean[True]), 2),
        "speedup": round(sum(mean[False]) / max(1e-9, sum(mean[True])), 2),
        "sub_goals_solved_per_wave": round(counts["sub_goals_solved"] / runs, 1),
        "sub_goals_shared_per_wave": round(counts["sub_goals_shared"] / runs, 1),
        "waves_with_same_answers": f"{same} of {runs}",
        "program": repo_relative(args.program),
    }
    path = write_results(results, args)
    print(
        f"execute phase: {results['mean_execute_s_off']} s -> {results['mean_execute_s_on']} s per wave "
        f"({results['speedup']}x); sub-goals solved / shared per wave {results['sub_goals_solved_per_wave']} / "
        f"{results['sub_goals_shared_per_wave']}; same answers in {results['waves_with_same_answers']}; {path}"
    )


if __name__ == "__main__":
    main()
