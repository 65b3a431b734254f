"""The runner every paper experiment shares (``experiments/<paper>.py``): rows trained, saved, evaluated and reported.

For each dataset and row of a paper's config (``_paper_config``), :class:`Experiment`:

1. obtains the row's program: prompt-only rows are built; trained rows are trained (a warm start first: the saved
   program of the row named by ``warm_start``, trained itself when missing) and saved to
   ``runs/experiments/<paper>/<dataset>/<row>/program`` with a ``train.json`` (minutes, optimizer steps, what it was
   trained on: dataset, questions, optimizer settings); a saved program whose settings match is reused, never retrained;
   a row trained on the synthetic world for several evaluated datasets is trained once, under ``.../synthetic/<row>``;
2. evaluates it on the dataset's held-out questions into ``.../<dataset>/<row>/eval`` (resuming its records);
3. writes the finished row at once to ``experiments/results/<paper>.json`` and rebuilds ``<paper>.md`` and
   ``<paper>.png``: a killed run keeps its finished rows, and a rerun resumes the rest. A finished row whose saved
   program has been trained again since (:meth:`Experiment.stale`) is evaluated again, not kept.
"""

from __future__ import annotations

import dataclasses
import gc
import hashlib
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _paper_config import DATASETS, METHODS, REPO, PaperConfig, Row
from _paper_report import EMBEDDED_MODEL, rewrite_readme, write_report
from _paper_train import attach_teacher, bootstrap_fewshot, make_optimizer, optimizer_settings, steps_of

SHARED_DATA = REPO.parent / "shared" / "data"
RESULTS = REPO / "experiments" / "results"
RUNS = REPO / "runs" / "experiments"
README = REPO / "experiments" / "README.md"
SEED = 0


def data_file(dataset: str) -> Path:
    """The real dev subset of ``dataset`` in ../shared/data (beside the checkout)."""
    from rolecall.data.corpus import DEV_SUBSET_FILES

    return SHARED_DATA / DEV_SUBSET_FILES[dataset]


@dataclass
class Data:
    """One dataset as the experiments use it: its train split, held-out test questions and closed-corpus BM25."""

    name: str
    train: list[Any]
    test: list[Any]
    corpus: list[Any]
    _retriever: Any = None

    @property
    def retriever(self) -> Any:
        if self._retriever is None:
            from rolecall.retrievers.bm25 import BM25

            self._retriever = BM25(self.corpus)
        return self._retriever

    def has(self, needs: str) -> bool:
        """Whether its train split carries what a method needs (gold decompositions, or just answers)."""
        if needs == "decomposition":
            return any(e.decomposition for e in self.train)
        return bool(self.train)

    def trainset(self, needs: str, n: int) -> list[Any]:
        keep = [e for e in self.train if e.decomposition] if needs == "decomposition" else list(self.train)
        return keep[:n]


class Experiment:
    """One paper's run at one size: data, where programs and records go, and the results file."""

    def __init__(
        self,
        config: PaperConfig,
        size_name: str,
        *,
        out: Path,
        runs: Path,
        model: str | None,
        threads: int | None = None,
        test_questions: int | None = None,
    ) -> None:
        self.config = config
        self.size_name = size_name
        size = config.sizes[size_name]
        changes = {k: v for k, v in (("threads", threads), ("test_questions", test_questions)) if v}
        self.size = dataclasses.replace(size, **changes)
        self.tag = config.paper if size_name == "default" else f"{config.paper}_{size_name}"
        self.runs = runs / self.tag
        self.results = out / f"{self.tag}.json"
        self.model = model
        self._data: dict[str, Data | None] = {}

    # ------------------------------------------------------------------------------------------------ data
    def data(self, dataset: str) -> Data | None:
        """``dataset``'s splits (cached), or None when its file is absent."""
        if dataset not in self._data:
            self._data[dataset] = self._load(dataset)
        return self._data[dataset]

    def _load(self, dataset: str) -> Data | None:
        if dataset == "synthetic":
            from rolecall.data.synthetic import synthetic_world

            world = synthetic_world(seed=SEED)
            return Data(
                "synthetic", list(world.train), list(world.test[: self.size.test_questions]), list(world.corpus)
            )
        path = data_file(dataset)
        if not path.is_file():
            return None
        from rolecall.data import hash_split
        from rolecall.data.corpus import build_corpus, load_dataset

        train, test = hash_split(load_dataset(dataset, path), fraction=0.8)
        return Data(dataset, list(train), list(test[: self.size.test_questions]), list(build_corpus(dataset, path)))

    # ------------------------------------------------------------------------------------------------ where
    def train_on(self, dataset: str, row: Row) -> str:
        """The dataset ``row`` trains on when evaluated on ``dataset`` (see ``Row.train_on``)."""
        method = METHODS[row.method]
        if row.method == "eval":
            return self.train_on(dataset, self.config.row(row.warm_start))
        if not method.trains:
            return ""
        if row.train_on == "synthetic" or dataset == "synthetic":
            return "synthetic"
        data = self.data(dataset)
        return dataset if data is not None and data.has(method.needs) else "synthetic"

    def lineage(self, dataset: str, row: Row) -> set[str]:
        """Every dataset the row's program, its warm start and its teacher (recursively) were trained on."""
        out = {self.train_on(dataset, row)} - {""}
        for link in (row.warm_start, row.teacher):
            if link:
                out |= self.lineage(dataset, self.config.row(link))
        return out

    def program_dir(self, dataset: str, row: Row) -> Path:
        """Where the row's program and train.json live: under the dataset it was trained on when its whole lineage
        trained there (so a synthetic-trained row serves every dataset from one training), else under ``dataset``."""
        lineage = self.lineage(dataset, row)
        home = next(iter(lineage)) if len(lineage) == 1 else dataset
        return self.runs / home / row.name

    def eval_dir(self, dataset: str, row: Row) -> Path:
        return self.runs / dataset / row.name / "eval"

    def fingerprint(self, dataset: str, row: Row) -> str:
        """A hash of everything the row's program depends on: the row, the size's training fields, the model, the
        training data and its warm start's / teacher's fingerprints."""
        size = dataclasses.asdict(self.size)
        for key in ("test_questions", "threads"):
            size.pop(key)
        parts: dict[str, Any] = {
            "row": dataclasses.asdict(row)
            | {"paper": None, "note": None, "label": None, "paper_row": None, "paper_table": None},
            "size": size,
            "model": self.model,
            "train_on": self.train_on(dataset, row),
        }
        for link in ("warm_start", "teacher"):
            if getattr(row, link):
                parts[link] = self.fingerprint(dataset, self.config.row(getattr(row, link)))
        blob = json.dumps(parts, sort_keys=True, default=str)
        return hashlib.sha1(blob.encode()).hexdigest()[:12]

    def n_train(self, row: Row) -> int:
        return min(self.size.train_questions, row.train_questions or self.size.train_questions)

    # ------------------------------------------------------------------------------------------------ programs
    def new_lm(self) -> Any:
        from rolecall.lm import LocalLM
        from rolecall.lm.embedded import DEFAULT_LM

        kwargs = {"max_tokens": self.size.max_tokens} if self.size.max_tokens else {}
        return LocalLM(self.model or DEFAULT_LM, **kwargs)

    def ensure_trained(self, dataset: str, row: Row) -> dict[str, Any]:
        """The row's train.json, training the row (and its warm start / teacher first) when no matching program is
        saved. Raises whatever the optimizer raises."""
        warm = self.ensure_trained(dataset, self.config.row(row.warm_start)) if row.warm_start else None
        teacher = self.ensure_trained(dataset, self.config.row(row.teacher)) if row.teacher else None
        folder, fingerprint = self.program_dir(dataset, row), self.fingerprint(dataset, row)
        # a warm start trained again since this row trained from it makes this row stale too
        parents = {
            "warm_start_trained_at": (warm or {}).get("trained_at"),
            "teacher_trained_at": (teacher or {}).get("trained_at"),
        }
        meta = folder / "train.json"
        if (folder / "program" / "program.json").is_file() and meta.is_file():
            info = json.loads(meta.read_text(encoding="utf-8"))
            if info.get("fingerprint") == fingerprint and all(info.get(k) == v for k, v in parents.items()):
                return info
            print(
                f"    {row.name}: its saved program was trained with other settings or from another warm start; "
                "training it again",
                flush=True,
            )
        shutil.rmtree(folder / "program", ignore_errors=True)
        if row.method == "eval":
            info = self._derive(dataset, row, warm)
        else:
            info = self._train(dataset, row, warm, teacher)
        info |= {
            "fingerprint": fingerprint,
            "warm_start": row.warm_start or None,
            "teacher": row.teacher or None,
            **parents,
        }
        info.setdefault("trained_at", time.strftime("%Y-%m-%d %H:%M:%S") + f".{time.time_ns() % 10**9:09d}")
        info["total_minutes"] = round(info["minutes"] + sum(x["total_minutes"] for x in (warm, teacher) if x), 2)
        folder.mkdir(parents=True, exist_ok=True)
        meta.write_text(json.dumps(info, indent=2, default=str) + "\n", encoding="utf-8")
        return info

    def _train(self, dataset: str, row: Row, warm: dict | None, teacher: dict | None) -> dict[str, Any]:
        from rolecall.programs.registry import build_program, get_program_class, parse_program_options

        on, method = self.train_on(dataset, row), METHODS[row.method]
        data = self.data(on)
        if data is None:  # pragma: no cover - train_on only picks datasets that loaded
            raise FileNotFoundError(f"{row.name}: training data {on} is missing")
        trainset = data.trainset(method.needs, self.n_train(row))
        if not trainset:
            raise ValueError(f"{row.name}: no {on} training question carries what {row.method} needs ({method.needs})")
        folder = self.program_dir(dataset, row)
        budget = optimizer_settings(row, self.size).get("budget_minutes")
        print(
            f"    training {row.name} ({row.title}) on {len(trainset)} {on} questions"
            + (f", budget {budget:g} min" if budget else "")
            + (f", from {row.warm_start}" if row.warm_start else ""),
            flush=True,
        )
        lm = self.new_lm()
        cls = get_program_class(row.program)
        try:
            if warm is not None:
                program = cls.load(
                    self.program_dir(dataset, self.config.row(row.warm_start)) / "program",
                    retriever=data.retriever,
                    lm=lm,
                )
            else:
                pairs = [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in row.options.items()]
                program = build_program(row.program, data.retriever, lm, **parse_program_options(row.program, pairs))
            if teacher is not None:
                own = attach_teacher(lm, self.program_dir(dataset, self.config.row(row.teacher)) / "program")
                if own in program.adapter_roles():  # the Teacher's adapter name is the team's: load the team back
                    program = cls.load(
                        self.program_dir(dataset, self.config.row(row.warm_start)) / "program",
                        retriever=data.retriever,
                        lm=lm,
                    )
            started = time.perf_counter()
            if row.method == "bootstrap_fewshot":
                program, optimizer = bootstrap_fewshot(row, program, trainset), None
            else:
                optimizer = make_optimizer(row, self.size, folder / "train", SEED)
                program = program.compile(optimizer=optimizer, trainset=trainset)
            minutes = (time.perf_counter() - started) / 60
            program.save(folder / "program")
        finally:
            release(lm)
        return {
            "method": row.method,
            "label": row.title,
            "on": on,
            "questions": len(trainset),
            "minutes": round(minutes, 2),
            "steps": steps_of(optimizer) if optimizer is not None else {},
            "stop_reason": getattr(optimizer, "stop_reason", None),
            "settings": optimizer_settings(row, self.size),
            "model": self.model or EMBEDDED_MODEL,
        }

    def _derive(self, dataset: str, row: Row, warm: dict | None) -> dict[str, Any]:
        """An ``eval`` row's program: its warm start's saved program with the row's options changed."""
        source = self.program_dir(dataset, self.config.row(row.warm_start)) / "program"
        target = self.program_dir(dataset, row) / "program"
        shutil.copytree(source, target, dirs_exist_ok=True)
        payload = json.loads((target / "program.json").read_text(encoding="utf-8"))
        payload.setdefault("config", {}).setdefault("options", {}).update(row.options)
        (target / "program.json").write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
        if warm is None:  # check_config makes every eval row name a trained warm start
            raise ValueError(f"{row.name}: an eval row needs the warm start it evaluates")
        return {
            **{k: warm[k] for k in ("on", "questions", "steps", "settings", "model") if k in warm},
            "method": "eval",
            "label": row.title,
            "minutes": 0.0,
            "derived_from": row.warm_start,
            "options": row.options,
            "trained_at": warm.get("trained_at"),
        }

    def eval_program(self, dataset: str, row: Row, lm: Any) -> Any:
        from rolecall.programs.registry import build_program, get_program_class, parse_program_options

        data = self.data(dataset)
        cls = get_program_class(row.program)
        if row.has_program:
            return cls.load(self.program_dir(dataset, row) / "program", retriever=data.retriever, lm=lm)
        pairs = [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in row.options.items()]
        retriever = data.retriever if getattr(cls, "uses_retriever", True) else None
        return build_program(row.program, retriever, lm, **parse_program_options(row.program, pairs))

    # ------------------------------------------------------------------------------------------------ rows
    def run_row(self, dataset: str, row: Row) -> dict[str, Any]:
        """Train (or reuse) and evaluate one row on one dataset; returns its result row."""
        from rolecall.evaluation import evaluate

        trains = row.has_program
        info = self.ensure_trained(dataset, row) if trains else None
        out = self.eval_dir(dataset, row)
        stamp = out / "experiment.json"
        if info:
            program_id = f"{info['fingerprint']}@{info.get('trained_at')}"
        else:
            program_id = json.dumps([row.program, row.options, self.model, self.size.max_tokens], default=str)
        if stamp.is_file() and json.loads(stamp.read_text(encoding="utf-8")).get("program") != program_id:
            shutil.rmtree(out)  # records of another program: start this evaluation afresh
        out.mkdir(parents=True, exist_ok=True)
        stamp.write_text(json.dumps({"program": program_id}) + "\n", encoding="utf-8")
        data = self.data(dataset)
        lm = self.new_lm()
        try:
            program = self.eval_program(dataset, row, lm)
            started = time.perf_counter()
            result = evaluate(
                program,
                data.test,
                num_threads=self.size.threads,
                output_dir=out,
                show_progress=False,
                resume=(out / "records.jsonl").is_file(),
            )
            eval_minutes = (time.perf_counter() - started) / 60
        finally:
            release(lm)
        s = result.summary
        calls = s.lm_calls or 1.0
        return {
            **self.row_head(dataset, row),
            "status": "done",
            "n": s.n,
            "em": s.em,
            "em_ci": list(s.em_ci),
            "f1": s.f1,
            "cover_em": s.cover_em,
            "success_rate": s.success_rate,
            "n_errors": s.n_errors,
            "lm_calls_per_question": round(s.lm_calls, 2),
            "prompt_tokens_per_call": round(s.prompt_tokens / calls, 1),
            "parse_rates": s.parse_rates,
            "eval_minutes": round(eval_minutes, 2),
            "train": {k: v for k, v in (info or {}).items() if k != "fingerprint"} or None,
        }

    def row_head(self, dataset: str, row: Row) -> dict[str, Any]:
        return {
            "dataset": dataset,
            "row": row.name,
            "label": row.title,
            "program": row.program,
            "method": row.method,
            "paper_row": row.paper_row,
            "paper_table": row.paper_table,
            "paper": row.paper.get(dataset),
        }

    def plan(self, datasets: list[str], rows: list[Row]) -> list[tuple[str, Row]]:
        """The (dataset, row) jobs to run, in order; prints a line for each dataset skipped."""
        jobs = []
        for dataset in datasets:
            if self.data(dataset) is None:
                print(f"skipping {dataset}: {data_file(dataset)} not found (../shared/data beside the checkout)")
                continue
            jobs += [(dataset, r) for r in rows if dataset in self.config.row_datasets(r)]
        return jobs

    def describe(self, dataset: str, row: Row) -> str:
        """One line saying what the row is trained on and for how long (before it runs)."""
        if not row.has_program:
            return f"{row.title}: not trained" + (f" (options {row.options})" if row.options else "")
        if row.method == "eval":
            return f"{row.title}: {row.warm_start}'s program with {row.options} (no training)"
        on = self.train_on(dataset, row)
        data = self.data(on)
        n = len(data.trainset(METHODS[row.method].needs, self.n_train(row))) if data is not None else 0
        settings = optimizer_settings(row, self.size)
        budget = f", within {settings['budget_minutes']:g} min" if "budget_minutes" in settings else ""
        where = f"trained on {on}" + (f", evaluated on {dataset}" if on != dataset else "")
        warm = f", warm start {row.warm_start}" if row.warm_start else ""
        teacher = f", Teacher {row.teacher}" if row.teacher else ""
        return f"{row.title}: {where} ({n} questions{budget}){warm}{teacher}"

    def known(self, result: dict[str, Any]) -> bool:
        """Whether the result's dataset loaded here: without it a row's program folder cannot be told (a row trained
        on that dataset would be looked for under the synthetic world's)."""
        return result["dataset"] == "synthetic" or self.data(result["dataset"]) is not None

    def saved_trained_at(self, dataset: str, row: Row) -> str | None:
        """The ``trained_at`` of the row's saved program, or None when none is saved (a killed training leaves
        train.json beside an emptied program folder; ``ensure_trained`` trains it again) or its train.json is
        unreadable."""
        folder = self.program_dir(dataset, row)
        if not (folder / "program" / "program.json").is_file():
            return None
        try:
            return json.loads((folder / "train.json").read_text(encoding="utf-8")).get("trained_at")
        except (OSError, ValueError):
            return None

    def _result_row(self, result: dict[str, Any]) -> Row | None:
        """The config row a finished result belongs to, when the config still has it and its dataset loaded here."""
        row = next((r for r in self.config.rows if r.name == result.get("row")), None)
        return row if row is not None and self.known(result) else None

    def stale(self, result: dict[str, Any]) -> str | None:
        """Why a finished result row no longer describes the program saved for it (None when it still does).

        A row's result records its program's ``trained_at``; when runs/ lost that program and a later row trained it
        again as its warm start, the saved program is a different one and the committed result describes the older.
        A row that is not trained, or whose program is no longer saved, is never stale: there is nothing newer to
        evaluate without training."""
        row = self._result_row(result)
        if row is None or not row.has_program:
            return None
        saved = self.saved_trained_at(result["dataset"], row)
        recorded = (result.get("train") or {}).get("trained_at")
        if saved is None or saved == recorded:
            return None
        return f"its result describes the program trained at {recorded}; runs/ now holds the one trained at {saved}"

    def outdated(self, result: dict[str, Any]) -> str | None:
        """Why a finished row's program is older than its saved warm start or Teacher (None when it is not).

        Its result still describes its own program, so it is kept (evaluating again would not change it), but it is
        no longer comparable with its warm start's row: ``--fresh`` on it trains it again from the saved one."""
        row, train = self._result_row(result), result.get("train") or {}
        if row is None:
            return None
        for link in ("warm_start", "teacher"):
            parent = getattr(row, link)
            if not parent or f"{link}_trained_at" not in train:
                continue
            saved = self.saved_trained_at(result["dataset"], self.config.row(parent))
            if saved is not None and train[f"{link}_trained_at"] != saved:
                return f"it was trained from an earlier {parent} program than the one runs/ now holds"
        return None

    # ------------------------------------------------------------------------------------------------ results
    def read_results(self) -> dict[str, Any]:
        try:
            return json.loads(self.results.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}

    def record(self, result: dict[str, Any], readme: Path | None) -> None:
        """Add one finished (or failed) row to the results JSON and rebuild the markdown and the chart."""
        saved = self.read_results()  # re-read: keeps every row written before this run too
        key = (result["dataset"], result["row"])
        rows = [r for r in saved.get("rows", []) if (r["dataset"], r["row"]) != key] + [result]
        self.write(rows, readme)

    def write(self, rows: list[dict[str, Any]], readme: Path | None) -> None:
        order = {(d, r.name): (i, j) for i, d in enumerate(DATASETS) for j, r in enumerate(self.config.rows)}
        rows = sorted(rows, key=lambda r: order.get((r["dataset"], r["row"]), (99, 99)))
        payload = {
            "paper": self.config.paper,
            "title": self.config.title,
            "size": self.size_name,
            "tag": self.tag,
            "size_settings": dataclasses.asdict(self.size),
            "model": self.model or EMBEDDED_MODEL,
            "machine": {"cpus": os.cpu_count(), "platform": sys.platform},
            "updated": time.strftime("%Y-%m-%d %H:%M:%S"),
            "rows": rows,
        }
        self.results.parent.mkdir(parents=True, exist_ok=True)
        self.results.write_text(json.dumps(payload, indent=2, default=str) + "\n", encoding="utf-8")
        write_report(self.config, payload, self.results.with_suffix(".md"), self.results.with_suffix(".png"))
        if readme is not None:
            rewrite_readme(readme, self.config, payload)


def release(lm: Any) -> None:
    """Stop ``lm``'s batcher thread so its model can be freed before the next row loads one."""
    batcher = getattr(getattr(lm, "backend", None), "batcher", None)
    if batcher is not None and hasattr(batcher, "close"):
        batcher.close()
    gc.collect()
