"""The Promela text generated from ``states.py``: the model's state numbers and its
transition guard, so the model and the module cannot drift apart."""

from __future__ import annotations

from pathlib import Path

from tether.states import TRANSITIONS, JobState

MODEL_DIR = Path(__file__).resolve().parents[2] / "src" / "tether" / "model"
STATES_PML = MODEL_DIR / "states.pml"


def states_pml() -> str:
    """``states.pml`` as it must read: one ``#define`` per state (in ``JobState``'s
    order) and ``LEGAL(f, t)``, true exactly for the pairs in ``TRANSITIONS``."""
    order = list(JobState)
    lines = [
        "/* Generated from src/tether/states.py (JobState, TRANSITIONS); do not edit.",
        " * Regenerate: PYTHONPATH=src python -m tests.model.promela",
        " * tests/model/test_protocol_model.py fails when this file and states.py differ. */",
        "",
    ]
    lines += [f"#define {s.name} {i}" for i, s in enumerate(order)]
    lines.append("")
    terms = []
    for src in order:
        dsts = [d for d in order if d in TRANSITIONS[src]]
        if dsts:
            alts = " || ".join(f"(t) == {d.name}" for d in dsts)
            terms.append(f"    ((f) == {src.name} && ({alts}))")
    lines.append("#define LEGAL(f, t) ( \\")
    lines.append(" || \\\n".join(terms) + ")")
    return "\n".join(lines) + "\n"


def model_transitions(text: str) -> set[tuple[str, str]]:
    """The ``(from, to)`` pairs a ``states.pml`` text declares legal, read back from it."""
    pairs: set[tuple[str, str]] = set()
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("((f) == "):
            continue
        src = line.split("((f) == ", 1)[1].split(" ", 1)[0]
        for part in line.split("(t) == ")[1:]:
            dst = part.split(")", 1)[0].split(" ", 1)[0]
            pairs.add((JobState[src].value, JobState[dst].value))
    return pairs


if __name__ == "__main__":
    STATES_PML.write_text(states_pml())
    print(f"wrote {STATES_PML}")
