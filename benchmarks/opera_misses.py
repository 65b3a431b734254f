"""Where do an OPERA evaluation's misses come from? Each missed question of a synthetic-world evaluation is put in the
first bucket that explains it, by its recorded trajectory against the question's gold decomposition:

1. plan: the plan has a different number of sub-goals than the gold decomposition;
2. sub-answer k of n: the first sub-goal whose analysis answer is not the gold sub-answer (exact match), split two
   ways: did that sub-goal ask the gold sub-question (the same content words once the earlier gold answers fill its
   placeholders; a sub-goal asking another relation, "mother" for "father", is the plan's error), and did that
   analysis call's passages hold the gold sub-answer (if not, retrieval missed it);
3. synthesis: every sub-answer right, the final answer wrong.

Also per question subtype: questions, EM and plan misses.

    .venv/bin/python benchmarks/opera_misses.py runs/bench_rl_signal/synthetic/opera/sft_eval --world-test 500
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("records", type=Path, help="an evaluation folder (or its records.jsonl) of OPERA")
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthetic world (default 0)")
    parser.add_argument("--world-test", type=int, default=300, help="its test split's size (default 300)")
    args = parser.parse_args()

    from rolecall.data.synthetic import synthetic_world
    from rolecall.evaluation import read_records
    from rolecall.evaluation.metrics import exact_match
    from rolecall.optimizers.rewards.opera import plan_gold_match
    from rolecall.programs.core.plan import fill_placeholders
    from rolecall.utils.text import holds_answer

    world = synthetic_world(seed=args.seed, n_test=args.world_test)
    gold = {e.id: e for e in [*world.train, *world.dev, *world.test]}
    path = args.records / "records.jsonl" if args.records.is_dir() else args.records
    buckets: Counter[str] = Counter()
    by_type: dict[str, Counter[str]] = {}
    for record in read_records(path):
        example = gold.get(record.id)
        if example is None:
            raise SystemExit(f"{record.id} is not a question of the seed-{args.seed} world with --world-test "
                             f"{args.world_test}; pass the evaluation's world")  # fmt: skip
        steps = (record.trajectory or {}).get("steps", [])
        plans = [s for s in steps if s["kind"] == "role" and s["role"] == "plan"]
        goals = ((plans[-1].get("outputs") or {}).get("sub_goals") or []) if plans else []
        analyses = [s for s in steps if s["kind"] == "role" and s["role"] == "analysis"]
        answers = [str((s.get("outputs") or {}).get("answer", "")) for s in analyses]
        subtype = str(example.metadata.get("subtype", example.type))
        counts = by_type.setdefault(subtype, Counter())
        counts["questions"] += 1
        counts["right"] += int(record.em == 1)
        buckets["questions"] += 1
        if record.em == 1:
            buckets["right"] += 1
            continue
        if len(goals) != len(example.decomposition):
            buckets["miss: plan (sub-goal count)"] += 1
            counts["plan misses"] += 1
            continue
        wrong = [i for i, sub in enumerate(example.decomposition)
                 if i >= len(answers) or not exact_match(answers[i], [sub.answer])]  # fmt: skip
        if wrong:
            k = wrong[0]
            buckets[f"miss: sub-answer {k + 1} of {len(example.decomposition)}"] += 1
            passages = str((analyses[k].get("inputs") or {}).get("passages", "")) if k < len(analyses) else ""
            held = holds_answer(passages, example.decomposition[k].answer)
            buckets["miss: sub-answer, " + ("passages held it" if held else "passages lacked it")] += 1
            known = {i: sub.answer for i, sub in enumerate(example.decomposition, 1)}
            asked = fill_placeholders(example.decomposition[k].question, known, before=k + 1)[0]
            goal = str((analyses[k].get("inputs") or {}).get("sub_goal", "")) if k < len(analyses) else ""
            same = plan_gold_match([goal], [{"question": asked}]) == 1.0  # the rule the gold plan judge uses
            which = "asked the gold sub-question" if same else "asked another question"
            buckets[f"miss: sub-answer, {which}"] += 1
        else:
            buckets["miss: synthesis (every sub-answer right)"] += 1
    for key, value in sorted(buckets.items()):
        print(f"{key:45s} {value}")
    print()
    for subtype, counts in sorted(by_type.items()):
        n = counts["questions"]
        print(f"{subtype:25s} n={n:4d}  EM={counts['right'] / n:.2f}  plan misses={counts['plan misses']}")


if __name__ == "__main__":
    main()
