"""An experiment's Markdown section from its JSON record (pure: no models, no files)."""

from __future__ import annotations


def table(columns: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def markdown(record: dict, figure: str | None, level: int = 2) -> str:
    """The section: title, the paper's claim, the command, the machine, the finding, the table, notes, the figure."""
    meta, data = record["meta"], record["data"]
    ar = data.get("ar_tokens_per_second")
    machine = f"{meta['cpu']}, {meta['cores']} cores" + (f"; `ar` decodes at {ar:.0f} tokens/s here" if ar else "")
    head = "#" * level
    parts = [
        f"{head} {record['title']}",
        f"**The paper's claim.** {record['claim']}",
        f"**Command.** `{meta['command']}` ({record['seconds']:.0f} s; {meta['date']}; {machine}; pair "
        f"{record['models'].get('target', '?')} / {record['models'].get('draft', '?')}).",
        f"**Found on this pair.** {record['finding']}.",
        table(record["columns"], record["rows"]),
    ]
    if record["notes"]:
        parts.append("\n".join(f"- {n}" for n in record["notes"]))
    if figure:
        parts.append(f"![{record['title']}]({figure})")
    return "\n\n".join(parts) + "\n"
