"""How the CLI shows tasks to a person: one task as fields, a page as a table."""

from typing import Any

from rich.console import Console
from rich.table import Table

_console = Console()


def print_task(task: Any) -> None:
    table = Table(show_header=False, box=None)
    for name, value in task.model_dump(mode="json", exclude_none=True).items():
        table.add_row(f"[bold]{name}[/]", str(value))
    _console.print(table)


def print_page(page: Any) -> None:
    table = Table("id", "status", "v", "due_at", "type", "lateness ms", "attempts")
    for task in page.tasks:
        lateness = "" if task.lateness_ms is None else str(task.lateness_ms)
        table.add_row(
            task.id,
            task.status,
            str(task.version),
            task.due_at.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            task.type,
            lateness,
            f"{task.attempts}/{task.max_attempts}",
        )
    _console.print(table)
    if page.next:
        _console.print(f"more: --next {page.next}")


def print_schedules(page: Any) -> None:
    table = Table("id", "state", "expression", "timezone", "next due", "occurrences", "missed")
    for schedule in page.schedules:
        next_due = schedule.next_due_at
        table.add_row(
            schedule.id,
            schedule.state,
            schedule.expression,
            schedule.timezone,
            "" if next_due is None else next_due.isoformat(timespec="milliseconds"),
            str(schedule.occurrences),
            str(schedule.missed),
        )
    _console.print(table)
    if page.next:
        _console.print(f"more: --next {page.next}")


def print_held(targets: Any) -> None:
    if not targets.held:
        _console.print("no host is held back")
        return
    table = Table()
    table.add_column("host", no_wrap=True)  # whole, to be copied
    for heading in ("type", "held since", "failures", "waiting", "last error"):
        table.add_column(heading)
    for host in targets.held:
        table.add_row(
            host.host,
            host.task_type,
            host.held_since,
            str(host.failures),
            str(host.waiting),
            host.last_error or "",
        )
    _console.print(table)


def print_redrive(report: Any) -> None:
    table = Table("task", "version", "outcome")
    for task_id, version, outcome in report.tasks:
        table.add_row(task_id, str(version), outcome)
    _console.print(table)
    counts = ", ".join(f"{n} {outcome}" for outcome, n in sorted(report.outcomes.items()))
    _console.print(counts or "the dead-letter queue is empty")
