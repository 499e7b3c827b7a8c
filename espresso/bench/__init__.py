"""The benchmarking harness: suites of jobs planned by Espresso and every baseline
(:mod:`espresso.baselines`), in parallel processes or on a Ray cluster, into a tidy table,
a markdown summary and plots (docs/benchmarks.md; ``espresso bench run SUITE --out DIR``).

* :func:`load_suite` reads a suite file (:mod:`espresso.bench.suite` has the format);
* :func:`run_suite` runs it into a results folder, one row per plan as soon as it is known;
* :func:`report` writes ``summary.md`` and ``plots/`` from the rows alone.
"""

from .report import report, savings_table, summary_markdown
from .run import ROW_FIELDS, read_rows, run_suite, run_task, tasks_of
from .suite import Cell, Suite, load_suite, suite_from_dict

__all__ = ["ROW_FIELDS", "Cell", "Suite", "load_suite", "read_rows", "report", "run_suite",
           "run_task", "savings_table", "suite_from_dict", "summary_markdown", "tasks_of"]
