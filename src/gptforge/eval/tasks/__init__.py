"""The evaluation tasks, by name. Each module renders its dataset's rows; see ``base.Task``.

    gptforge eval --tasks hellaswag,piqa,arc_easy,arc_challenge,winogrande,openbookqa,sciq,lambada --hf gpt2
"""

from __future__ import annotations

from gptforge.eval.tasks import arc, hellaswag, lambada, openbookqa, piqa, sciq, winogrande
from gptforge.eval.tasks.base import EvalDataError, EvalDataMissing, Example, MalformedExample, Task, load_rows

TASKS: dict[str, Task] = {
    t.name: t
    for t in (hellaswag.TASK, piqa.TASK, arc.EASY, arc.CHALLENGE, winogrande.TASK, openbookqa.TASK, sciq.TASK,
              lambada.TASK)
}

__all__ = ["TASKS", "EvalDataError", "EvalDataMissing", "Example", "MalformedExample", "Task", "cached_data_problem",
           "get_tasks", "load_rows"]


def get_tasks(names: str | list[str]) -> list[Task]:
    """Tasks from a comma-separated string or a list; unknown names raise EvalDataError listing the known ones."""
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    if not names:
        raise EvalDataError(f"no tasks given; choose from {', '.join(TASKS)}")
    unknown = [n for n in names if n not in TASKS]
    if unknown:
        raise EvalDataError(f"unknown task(s) {', '.join(unknown)}; known: {', '.join(TASKS)}")
    return [TASKS[n] for n in dict.fromkeys(names)]


def cached_data_problem(task: str) -> str | None:
    """Why ``task``'s cached rows cannot be used, read and rendered as eval reads them (every row), or None:
    what ``gptforge assets evals`` asks before it keeps a cached file instead of fetching it again."""
    from gptforge.eval.tasks.verifiable import gsm8k_problems

    try:
        if task == "gsm8k":
            gsm8k_problems()
        else:
            rows = load_rows(task)
            for i, row in enumerate(rows):
                TASKS[task].render(row, i)
    except (EvalDataError, EvalDataMissing) as e:
        return str(e)
    return None
