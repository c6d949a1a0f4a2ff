"""A workflow: named jobs and the dependencies between them, enqueued all at once."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tether.errors import InvalidJobError
from tether.job import JSON


@dataclass
class Node:
    """One job of a workflow, before it is enqueued."""

    name: str
    task: str
    args: dict[str, JSON]
    depends_on: list[str | int]
    options: dict[str, Any] = field(default_factory=dict)


class Workflow:
    """Build a graph of jobs; ``App.enqueue_workflow`` writes it in one transaction.

    ``depends_on`` names other nodes of this workflow (in any order) or ids of jobs that
    already exist. A job runs once all it depends on have succeeded; if one fails or is
    cancelled, everything downstream is cancelled.
    """

    def __init__(self) -> None:
        self.nodes: dict[str, Node] = {}

    def add(
        self,
        name: str,
        task: Any,
        args: dict[str, JSON] | None = None,
        *,
        depends_on: Sequence[str | int] = (),
        **options: Any,
    ) -> str:
        """Add a job named ``name`` (a Task or task name); returns the name."""
        if name in self.nodes:
            raise InvalidJobError(f"the workflow already has a job named {name!r}")
        task_name = task if isinstance(task, str) else task.name
        self.nodes[name] = Node(name, task_name, dict(args or {}), list(depends_on), options)
        return name

    def order(self) -> list[Node]:
        """The nodes with every dependency before its dependents.

        Raises :class:`InvalidJobError` for an unknown name or a cycle (naming it).
        """
        for node in self.nodes.values():
            for dep in node.depends_on:
                if isinstance(dep, str) and dep not in self.nodes:
                    raise InvalidJobError(f"{node.name!r} depends on unknown job {dep!r}")
                if dep == node.name:
                    raise InvalidJobError(f"{node.name!r} depends on itself")
        done: list[Node] = []
        state: dict[str, int] = {}  # 1: on the current path, 2: placed

        def visit(node: Node, path: list[str]) -> None:
            mark = state.get(node.name)
            if mark == 2:
                return
            if mark == 1:
                cycle = [*path[path.index(node.name) :], node.name]
                raise InvalidJobError(f"dependency cycle: {' -> '.join(cycle)}")
            state[node.name] = 1
            for dep in node.depends_on:
                if isinstance(dep, str):
                    visit(self.nodes[dep], [*path, node.name])
            state[node.name] = 2
            done.append(node)

        for node in self.nodes.values():
            visit(node, [])
        return done
