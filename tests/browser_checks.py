"""Checks of what Chromium drew, shared by the browser tests: a tree plot's node labels, read as the boxes the
browser laid out."""

from __future__ import annotations

LABEL_BOXES = """(sel) => Array.from(document.querySelectorAll(sel + ' g.textpoint text')).map(t => {
    const r = t.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom, t.textContent]; })"""


def label_overlaps(page, plot: str) -> tuple[int, list]:
    """The node labels drawn in `#plot` (their count) and every pair of them whose boxes overlap (> 0.5 px)."""
    boxes = page.evaluate(LABEL_BOXES, f"#{plot}")
    clash = [(a[4], b[4]) for i, a in enumerate(boxes) for b in boxes[i + 1:]
             if min(a[2], b[2]) - max(a[0], b[0]) > 0.5 and min(a[3], b[3]) - max(a[1], b[1]) > 0.5]
    return len(boxes), clash


def check_labels(page, plot: str) -> None:
    """No two labels of the tree in `#plot` overlap, and every node has its label unless the title says the tokens
    are on hover."""
    count, clash = label_overlaps(page, plot)
    title = page.locator(f"#{plot} .gtitle").text_content() or ""
    nodes = page.locator(f"#{plot} .scatterlayer .point").count()
    assert not clash, (plot, title, clash[:5])
    assert count == nodes or (count == 0 and "tokens on hover" in title), (plot, title, count, nodes)
