"""Prometheus's text exposition format (version 0.0.4), for the families serve adds to Triton's own on its metrics
port (metrics_front.py): a family's HELP and TYPE lines, then one line per sample, label values escaped."""

from __future__ import annotations

from dataclasses import dataclass, field

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(frozen=True)
class Family:
    """One metric: `name`, `kind` ("counter" or "gauge"), its HELP text, and its samples as (labels, value)."""

    name: str
    kind: str
    help: str
    samples: list[tuple[dict[str, str], float]] = field(default_factory=list)


def _label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def render(families: list[Family]) -> str:
    """The families as exposition text, ending with a newline. A family without samples keeps its HELP and TYPE
    lines (a counter nothing has counted yet is still declared)."""
    lines = []
    for family in families:
        lines.append(f"# HELP {family.name} {_help(family.help)}")
        lines.append(f"# TYPE {family.name} {family.kind}")
        for labels, value in family.samples:
            labelled = ",".join(f'{key}="{_label_value(text)}"' for key, text in labels.items())
            lines.append(f"{family.name}{{{labelled}}} {_number(value)}" if labelled
                         else f"{family.name} {_number(value)}")
    return "\n".join(lines) + "\n"
