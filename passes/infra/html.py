"""index.html of a dump folder: the passes in order, each with a side-by-side diff against the previous
snapshot, changed/no-op marks and node-count deltas. Static HTML (the diffs are rendered here); a few
lines of script only filter rows. Deterministic: the same run gives the same bytes."""
from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from html import escape

CONTEXT_LINES = 3


@dataclass
class Row:
    index: int
    spec: str
    contract: str
    status: str                         # changed | no-op | skipped | not-applicable | failed | input
    note: str = ""
    delta: tuple[int, int, int] = (0, 0, 0)
    nodes: tuple[int, int] = (0, 0)
    rewrites: list[str] = field(default_factory=list)
    skips: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    before: str | None = None           # text of the previous snapshot (None: no diff to show)
    after: str | None = None


def render(header: list[tuple[str, str]], status: str, rows: list[Row]) -> str:
    ok = status == "ok"
    state = "ok" if ok else ("failed" if status.startswith("failed") else "running")
    banner = {"ok": "pipeline finished", "running": "incomplete: the run did not finish",
              "failed": status}[state]
    counts = _counts(rows)
    parts = [_HEAD, f'<body data-status="{state}">',
             "<h1>dspark opt — pass trace</h1>",
             f'<p class="banner {state}">{escape(banner)}</p>',
             "<table class=meta>" + "".join(f"<tr><th>{escape(k)}</th><td><code>{escape(v)}</code></td></tr>"
                                            for k, v in header) + "</table>",
             f'<p class=summary>{counts}. <label><input type=checkbox id=show-noop checked> show no-op and '
             f'skipped passes</label> · <a href="#" id=expand>expand all</a> · <a href="#" id=collapse>'
             f'collapse all</a> · <span id=shown></span></p>',
             _overview(rows)]
    parts += [_section(r) for r in rows]
    parts += [_SCRIPT, "</body></html>\n"]
    return "\n".join(parts)


def _counts(rows: list[Row]) -> str:
    passes = [r for r in rows if r.status != "input"]
    n = {s: sum(r.status == s for r in passes) for s in ("changed", "no-op", "skipped", "not-applicable", "failed")}
    shown = ", ".join(f"{v} {k}" for k, v in n.items() if v)
    return f"{len(passes)} pass applications" + (f": {shown}" if shown else "")


def _overview(rows: list[Row]) -> str:
    head = ("<tr><th>#</th><th>pass</th><th>status</th><th>contract</th><th>nodes</th><th>+added</th>"
            "<th>−removed</th><th>~modified</th><th>rewrites</th><th>snapshot</th></tr>")
    body = []
    for r in rows:
        links = " ".join(f'<a href="{escape(f)}">{escape(f.rsplit(".", 1)[-1])}</a>' for f in r.files)
        nodes = "" if r.status in ("skipped", "not-applicable") else \
            (str(r.nodes[1]) if r.status == "input" else f"{r.nodes[0]} → {r.nodes[1]}")
        add, rm, mod = (f"+{r.delta[0]}", f"−{r.delta[1]}", f"~{r.delta[2]}") if r.status != "input" else ("", "", "")
        body.append(f'<tr class="row {r.status}"><td>{r.index}</td><td><a href="#p{r.index}">{escape(r.spec)}</a></td>'
                    f'<td><span class="badge {r.status}">{r.status}</span></td><td>{escape(r.contract)}</td>'
                    f"<td>{nodes}</td><td class=add>{add}</td><td class=rm>{rm}</td><td class=mod>{mod}</td>"
                    f"<td>{len(r.rewrites) if r.status != 'input' else ''}</td><td>{links}</td></tr>")
    return "<table class=overview>" + head + "".join(body) + "</table>"


def _section(r: Row) -> str:
    title = f"#{r.index} {escape(r.spec)} <span class=\"badge {r.status}\">{r.status}</span>"
    if r.note:
        title += f" <span class=note>{escape(r.note)}</span>"
    body = []
    if r.rewrites:
        body.append("<p>rewrites:</p><ul class=records>" + "".join(f"<li><code>{escape(x)}</code></li>"
                                                                  for x in r.rewrites) + "</ul>")
    if r.skips:
        body.append("<p>did not fire:</p><ul class=records>" + "".join(f"<li><code>{escape(x)}</code></li>"
                                                                     for x in r.skips) + "</ul>")
    if r.status == "input" and r.after is not None:
        body.append(f"<pre class=snapshot>{escape(r.after)}</pre>")
    elif r.before is not None and r.after is not None:
        body.append(diff_table(r.before, r.after) if r.before != r.after else "<p class=same>no change</p>")
    is_open = " open" if r.status in ("changed", "failed") else ""
    return (f'<details id="p{r.index}" class="pass {r.status}"{is_open}><summary>{title}</summary>'
            + "".join(body) + "</details>")


def diff_table(a: str, b: str, context: int = CONTEXT_LINES) -> str:
    """Side-by-side diff of two snapshots, aligned by the value each line defines (node names are
    provenance, so a rewritten node lines up with its old self and shows what changed within the line)."""
    left, right = a.splitlines(), b.splitlines()
    rows = _aligned(left, right)
    changed = [k for k, (tag, _, _) in enumerate(rows) if tag != "eq"]
    shown = sorted({k for c in changed for k in range(c - context, c + context + 1) if 0 <= k < len(rows)})
    out = ["<table class=diff><colgroup><col class=ln><col><col class=ln><col></colgroup>"
           "<tr><th colspan=2>before</th><th colspan=2>after</th></tr>"]
    for n, k in enumerate(shown):
        if n and k != shown[n - 1] + 1:
            out.append("<tr class=gap><td colspan=4>⋯</td></tr>")
        out.append(_html_row(rows[k], left, right))
    return "".join(out) + "</table>"


def _key(line: str) -> str:
    """A definition line's key is the value it defines; any other line is its own key."""
    head = line.strip().split(" = ", 1)[0]
    return head if head.startswith("%") and " = " in line else line


def _aligned(left: list[str], right: list[str]) -> list[tuple[str, int | None, int | None]]:
    """(tag, left index, right index) rows: eq, chg (same key, new text), del, ins, or rep (a del beside an ins)."""
    matcher = difflib.SequenceMatcher(None, [_key(x) for x in left], [_key(x) for x in right], autojunk=False)
    rows: list[tuple[str, int | None, int | None]] = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            rows += [("eq" if left[i] == right[j] else "chg", i, j) for i, j in zip(range(i1, i2), range(j1, j2))]
            continue
        for k in range(max(i2 - i1, j2 - j1)):
            i = i1 + k if i1 + k < i2 else None
            j = j1 + k if j1 + k < j2 else None
            rows.append(("rep" if i is not None and j is not None else ("del" if j is None else "ins"), i, j))
    return rows


def _html_row(row: tuple[str, int | None, int | None], left: list[str], right: list[str]) -> str:
    tag, i, j = row
    a = escape(left[i]) if i is not None else None
    b = escape(right[j]) if j is not None else None
    if tag == "chg":
        a, b = _intraline(left[i], right[j])
    cls_a, cls_b = ("eq", "eq") if tag == "eq" else ("del", "ins")
    return f"<tr>{_cell(i, a, cls_a)}{_cell(j, b, cls_b)}</tr>"


def _cell(index: int | None, text: str | None, cls: str) -> str:
    if index is None:
        return "<td class=ln></td><td class=empty></td>"
    return f'<td class=ln>{index + 1}</td><td class="{cls}">{text}</td>'


def _intraline(a: str, b: str) -> tuple[str, str]:
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    ha, hb = [], []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        sa, sb = escape(a[i1:i2]), escape(b[j1:j2])
        ha.append(sa if tag == "equal" or not sa else f"<mark>{sa}</mark>")
        hb.append(sb if tag == "equal" or not sb else f"<mark>{sb}</mark>")
    return "".join(ha), "".join(hb)


_HEAD = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>dspark opt — pass trace</title>
<style>
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
code, pre, table.diff { font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 12px; }
table.meta th { text-align: left; padding-right: 1em; color: #555; font-weight: normal; }
.banner { padding: .4em .8em; border-radius: 4px; display: inline-block; }
.banner.ok { background: #d1e7dd; } .banner.failed { background: #f8d7da; } .banner.running { background: #fff3cd; }
table.overview { border-collapse: collapse; margin: 1em 0; }
table.overview td, table.overview th { border-bottom: 1px solid #ddd; padding: 2px 8px; text-align: left; }
.badge { font-size: 11px; padding: 1px 6px; border-radius: 8px; background: #eee; }
.badge.changed { background: #cfe2ff; } .badge.failed { background: #f8d7da; } .badge.no-op { background: #eee; }
.badge.skipped, .badge.not-applicable { background: #fff3cd; } .badge.input { background: #d1e7dd; }
td.add { color: #146c43; } td.rm { color: #b02a37; } td.mod { color: #6c4a00; }
details.pass { border: 1px solid #ddd; border-radius: 4px; margin: .6em 0; padding: .3em .6em; }
details.pass summary { cursor: pointer; font-weight: 600; }
.note { font-weight: normal; color: #666; }
table.diff { border-collapse: collapse; width: 100%; table-layout: fixed; margin-top: .5em; }
table.diff td { white-space: pre-wrap; word-break: break-all; vertical-align: top; padding: 0 4px; }
table.diff col.ln { width: 3.5em; }
table.diff td.ln { color: #999; text-align: right; user-select: none; }
table.diff td.del { background: #fbe9eb; } table.diff td.ins { background: #e6f4ea; }
table.diff td.empty { background: #f6f6f6; } table.diff tr.gap td { text-align: center; color: #999; }
table.diff mark { background: #f7c948; }
body.hide-noop .row.no-op, body.hide-noop .row.skipped, body.hide-noop .row.not-applicable,
body.hide-noop details.no-op, body.hide-noop details.skipped, body.hide-noop details.not-applicable { display: none; }
pre.snapshot { background: #f8f8f8; padding: .5em; overflow-x: auto; }
</style></head>"""

_SCRIPT = """<script>
(function () {
  var box = document.getElementById("show-noop");
  function update() {
    document.body.classList.toggle("hide-noop", !box.checked);
    var shown = document.querySelectorAll("details.pass").length;
    var kept = "details.pass.changed, details.pass.failed, details.pass.input";
    if (!box.checked) shown = document.querySelectorAll(kept).length;
    document.getElementById("shown").textContent = shown + " sections shown";
  }
  box.addEventListener("change", update);
  function all(open) { document.querySelectorAll("details.pass").forEach(function (d) { d.open = open; }); }
  document.getElementById("expand").addEventListener("click", function (e) { e.preventDefault(); all(true); });
  document.getElementById("collapse").addEventListener("click", function (e) { e.preventDefault(); all(false); });
  update();
  document.body.setAttribute("data-ready", "yes");
})();
</script>"""
